"""docs/design.md, section 1: which folder may import which. ``client/`` and ``server/`` import no
``sims``; ``scenarios/`` only the policies; ``strategies/`` nothing but itself; ``examples/`` only
the public API."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LEAVES = {"fairclip.plugins", "fairclip.atomic", "fairclip.root_error"}
"""Top-level modules that import nothing of fairclip but each other, usable from every folder."""
ALLOWED = {
    "strategies": {"fairclip.strategies"},
    "scenarios": {"fairclip.strategies", "fairclip.scenarios"},
    "client": {"fairclip.strategies", "fairclip.scenarios", "fairclip.client"},
    "server": {"fairclip.strategies", "fairclip.scenarios", "fairclip.client", "fairclip.server"},
}
PUBLIC = {"fairclip", "fairclip.flower", "fairclip.policies", "fairclip.plugins"}


def fairclip_imports(path: Path) -> set[str]:
    """Every ``fairclip...`` module a file imports (at any depth of the file)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "fairclip"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "fairclip":
            found.add(node.module)
    return found


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_component_folders_import_only_what_the_layout_allows(folder):
    allowed = ALLOWED[folder] | LEAVES
    for path in sorted((ROOT / folder).rglob("*.py")):
        for module in fairclip_imports(path):
            assert any(module == a or module.startswith(a + ".") for a in allowed), f"{path.name}: {module}"


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
    "fairclip.progress": {"fairclip.cli"},
    "fairclip.api": {"fairclip.cli", "fairclip"},
    "fairclip.benchmarks": {"fairclip.api"},
}
"""Modules at the top that nothing below imports: the command line (started by ``__main__``), its
progress display, the API (under the command line; ``fairclip`` exports it lazily) and the
benchmarks (``fairclip bench`` runs them through the API)."""


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
