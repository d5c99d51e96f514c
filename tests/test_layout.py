"""docs/design.md, section 1: which folder may import which, how large a folder may grow, and
that the error lists agree.

Every room of the package has a rule in :data:`RULES`: the rooms it may import. The rooms form
layers, and an arrow runs only downwards: ``strategies/`` (the policies) imports nothing but the
leaves; ``scenarios/`` the policies; ``client/`` those two; ``server/`` those three (what a
deployment runs never passes through ``sims/``); each subpackage of ``sims/`` what a deployment
runs, and the experiments (``compare``, ``tune``, ``reproduce``) the executors and the shared
sweep pieces but not one another; the benchmarks the executors and below; the API everything but
the command line; the command line only the public API. ``tools/`` (repository tooling, not
installed) may import the package; nothing installed imports it. ``examples/`` use the public API
only. A new folder or top-level module fails until it has a rule here.
"""

from __future__ import annotations

import ast
import inspect
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LEAVES = {"fairclip.plugins", "fairclip.atomic", "fairclip.root_error"}
"""Top-level modules that import nothing of fairclip but each other, usable from every folder."""
PUBLIC = {"fairclip", "fairclip.flower", "fairclip.policies", "fairclip.plugins"}

_LEAF_ROOMS = {"plugins", "atomic", "root_error"}
_DEPLOYMENT = {"strategies", "scenarios", "client", "server"} | _LEAF_ROOMS
"""What a deployment runs: the policies, the scenarios, the client and the server."""
_EXPERIMENT = _DEPLOYMENT | {"sims.executors", "sims.sweeps"}
"""What an experiment (compare, tune, reproduce) may use: a deployment's rooms, the executors and
the sweeps' shared pieces (folders, runs, plots, tracking) -- not another experiment."""
RULES: dict[str, set[str]] = {
    # the leaves
    "root_error": set(),
    "atomic": set(),
    "plugins": {"root_error"},
    # the rooms, bottom up
    "strategies": set(_LEAF_ROOMS),
    "scenarios": {"strategies"} | _LEAF_ROOMS,
    "client": {"strategies", "scenarios"} | _LEAF_ROOMS,
    "server": {"strategies", "scenarios", "client"} | _LEAF_ROOMS,
    "sims": set(),
    "sims.executors": set(_DEPLOYMENT),
    "sims.sweeps": set(_DEPLOYMENT),
    "sims.compare": set(_EXPERIMENT),
    "sims.tune": set(_EXPERIMENT),
    "sims.reproduce": set(_EXPERIMENT),
    "benchmarks": _DEPLOYMENT | {"sims.executors"},
    # the top-level modules
    "policies": {"strategies"},
    "flower": {"client", "server"},
    "errors": set(_DEPLOYMENT),
    "progress": set(),
    "api": _EXPERIMENT | {"sims.compare", "sims.tune", "sims.reproduce", "benchmarks", "errors", "progress"},
    "cli": {"api", "errors", "progress", "fairclip", "flower", "policies", "plugins"},
    "__main__": {"cli"},
    "fairclip": {"api", "errors", "scenarios"},
}
"""Each room of the installed package and the rooms it may import (besides itself). A room is a
top-level folder, a subpackage of ``sims/``, or a top-level module (``fairclip`` is the package's
``__init__``)."""
OUTSIDE = {"tests", "docs", "docker", "results", "tools", "examples"}
"""Top-level folders that are not installed."""
SIMS_SUBPACKAGE_LINES = 3_000
LARGEST_SHARE = 1 / 3


def fairclip_imports(path: Path) -> set[str]:
    """Every ``fairclip...`` module a file imports (at any depth of the file)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "fairclip"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "fairclip":
            found.add(node.module)
    return found


def test_leaves_import_nothing_of_fairclip_but_leaves():
    for module in LEAVES:
        assert fairclip_imports(ROOT / (module.removeprefix("fairclip.") + ".py")) <= LEAVES, module


def test_examples_use_the_public_api_only():
    paths = sorted((ROOT / "examples").rglob("*.py"))
    assert paths
    for path in paths:
        for module in fairclip_imports(path):
            assert module in PUBLIC, f"{path.relative_to(ROOT)}: {module}"


def _installed_files() -> list[Path]:
    """The modules the wheel installs: the files of each package ``pyproject.toml`` lists (a
    walk of the repository root would take in a ``.venv`` or build folder there too)."""
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    folders = [ROOT.joinpath(*package.split(".")[1:]) for package in packages]
    return sorted(path for folder in folders for path in folder.glob("*.py"))


PACKAGE_FILES = _installed_files()
MODULES = {
    ".".join(("fairclip", *path.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__"): path
    for path in PACKAGE_FILES
}


def module_imports(path: Path) -> set[str]:
    """The fairclip modules ``path`` imports (at any depth), relative imports resolved and
    ``from package import module`` as the module it names."""
    name = _name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "fairclip"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            if base.split(".")[0] == "fairclip":
                submodules = {f"{base}.{alias.name}" for alias in node.names} & set(MODULES)
                found |= submodules if len(submodules) == len(node.names) else {base, *submodules}
    return found


def _name(path: Path) -> str:
    return ".".join(("fairclip", *path.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__")


ONLY_FROM = {
    "fairclip.cli": {"fairclip.__main__"},
    "fairclip.progress": {"fairclip.cli", "fairclip.api"},
    "fairclip.api": {"fairclip.cli", "fairclip"},
    "fairclip.benchmarks": {"fairclip.api"},
}
"""Modules at the top that nothing below imports: the command line (started by ``__main__``), the
progress display (the command line's, and the API's ``progress=``), the API (under the command
line; ``fairclip`` exports it lazily) and the benchmarks (``fairclip bench`` runs them through the
API)."""


def test_nothing_below_imports_the_command_line_the_api_or_the_benchmarks():
    for path in PACKAGE_FILES:
        importer = _name(path)
        for module in module_imports(path):
            for top, allowed in ONLY_FROM.items():
                inside = importer == top or importer.startswith(top + ".")
                if (module == top or module.startswith(top + ".")) and not inside:
                    assert importer in allowed, f"{importer} imports {module}"


def test_the_command_line_imports_only_the_public_api():
    public = PUBLIC | {"fairclip.api", "fairclip.errors", "fairclip.progress"}
    assert module_imports(ROOT / "cli.py") <= public, module_imports(ROOT / "cli.py") - public


def test_no_import_cycles_even_through_imports_inside_functions():
    """Tarjan's strongly connected components of the module graph (a package's ``__init__``
    counts as imported with each of its submodules); every component must be one module."""
    graph = {}
    for name, path in MODULES.items():
        targets = set()
        for module in module_imports(path):
            while module and module not in MODULES:
                module = module.rpartition(".")[0]
            parts = module.split(".")  # a module, and the packages above it but the root's lazy API
            targets.add(module)
            targets |= {
                p for p in (".".join(parts[:i]) for i in range(2, len(parts))) if not name.startswith(p + ".")
            }
        graph[name] = {t for t in targets if t in MODULES and t != name}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    assert not cycles, cycles


def room(module: str) -> str:
    """The room of ``fairclip...`` module ``module`` (see :data:`RULES`)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "fairclip"
    if parts[1] == "sims" and len(parts) > 2:
        return f"sims.{parts[2]}"
    return parts[1]


def _ignored_by_git(names: set[str]) -> set[str]:
    """Those of the top-level folders ``names`` that git ignores (none where git cannot say)."""
    import subprocess

    done = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", *sorted(names)], capture_output=True, text=True
    )
    return set(done.stdout.split()) if done.returncode in (0, 1) else set()


def test_every_folder_and_top_level_module_has_a_rule():
    rooms = {room(name) for name in MODULES}
    assert rooms - set(RULES) == set(), "rooms without a rule in RULES"
    assert set(RULES) - rooms == set(), "rules for rooms that no longer exist"
    folders = {path.name for path in ROOT.iterdir() if path.is_dir() and any(path.rglob("*.py"))}
    folders -= {name for name in folders if name.startswith(".")}
    folders -= _ignored_by_git(folders)  # build/ of a wheel built here, say: not the repository's
    assert folders - OUTSIDE - set(RULES) == set(), "folders neither installed with a rule nor outside"


def test_every_subpackage_on_disk_is_installed():
    """A folder with an ``__init__.py`` inside an installed room is in ``pyproject.toml``'s
    ``packages`` (else the wheel leaves it out: a new dataset folder, a new ``sims`` subpackage)."""
    installed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    for folder in sorted(set(RULES) & {path.name for path in ROOT.iterdir() if path.is_dir()}):
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            package = ".".join(("fairclip", *init.parent.relative_to(ROOT).parts))
            assert package in installed, f"{package} is not in pyproject.toml's packages"


@pytest.mark.parametrize("importer_room", sorted(RULES))
def test_arrows_run_only_where_the_rules_allow(importer_room):
    """No arrow runs up or sideways: each import of another room is one its rule allows (imports
    inside functions count too)."""
    for name, path in MODULES.items():
        if room(name) != importer_room:
            continue
        for module in module_imports(path):
            target = room(module)
            if target != importer_room:
                allowed = RULES[importer_room]
                assert target in allowed, (
                    f"{name} imports {module}: {importer_room} -> {target} is not allowed"
                )


def test_the_rooms_form_layers():
    """The rules themselves have no cycle: an order of the rooms exists in which every arrow runs
    downwards."""
    placed: list[str] = []
    left = dict(RULES)
    while left:
        ready = [name for name, below in left.items() if below <= set(placed)]
        assert ready, f"the rules form a cycle among {sorted(left)}"
        placed.extend(sorted(ready))
        for name in ready:
            del left[name]


def test_nothing_installed_imports_the_repository_tooling():
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                modules = {node.module or ""}
            else:
                continue
            assert not any(m.split(".")[0] == "tools" or m.startswith("fairclip.tools") for m in modules), (
                name
            )


def test_tools_import_no_command_line():
    for path in sorted((ROOT / "tools").rglob("*.py")):
        for module in fairclip_imports(path):
            assert room(module) not in {"cli", "__main__"}, f"{path.relative_to(ROOT)}: {module}"


def _lines(paths) -> int:
    return sum(len(path.read_text().splitlines()) for path in paths)


def _room_lines() -> dict[str, int]:
    """Lines of ``*.py`` per top-level folder of the package, and per subpackage of ``sims``."""
    counts: dict[str, int] = {}
    for name, path in MODULES.items():
        parts = name.split(".")
        if len(parts) > 2 or (path.name == "__init__.py" and len(parts) == 2):
            keys = [parts[1]] + ([f"sims.{parts[2]}"] if parts[1] == "sims" and len(parts) > 3 else [])
        else:
            keys = ["(top-level modules)"]
        for key in keys:
            counts[key] = counts.get(key, 0) + len(path.read_text().splitlines())
    return counts


def test_no_subpackage_of_sims_is_over_3000_lines():
    subpackages = {key: n for key, n in _room_lines().items() if key.startswith("sims.")}
    assert subpackages
    assert {key: n for key, n in subpackages.items() if n > SIMS_SUBPACKAGE_LINES} == {}, subpackages


def test_no_folder_holds_over_a_third_of_the_package():
    counts = _room_lines()
    total = _lines(PACKAGE_FILES)
    folders = {key: n for key, n in counts.items() if "." not in key and not key.startswith("(")}
    assert sum(folders.values()) + counts.get("(top-level modules)", 0) == total
    assert {key: n for key, n in folders.items() if n > LARGEST_SHARE * total} == {}, (total, folders)


def _classes(module) -> dict[str, type]:
    return {name: getattr(module, name) for name in module.__all__ if inspect.isclass(getattr(module, name))}


def test_the_error_lists_agree_and_every_error_derives_from_the_root():
    """``fairclip.__all__``'s errors, ``fairclip._ERRORS`` and ``fairclip.errors.__all__`` name the
    same classes, each a :class:`FairclipError` (the root itself among them), and ``fairclip``
    hands out the very classes :mod:`fairclip.errors` defines."""
    import fairclip
    import fairclip.errors as errors

    defined = _classes(errors)
    assert set(defined) == set(errors.__all__) - {"describe", "one_line"}
    assert all(inspect.isfunction(getattr(errors, name)) for name in set(errors.__all__) - set(defined))
    assert set(fairclip._ERRORS) == set(defined)
    exported = {name for name in fairclip.__all__ if name.endswith("Error")}
    assert exported == set(defined)
    for name, error in defined.items():
        assert issubclass(error, errors.FairclipError), name
        assert getattr(fairclip, name) is error, name
