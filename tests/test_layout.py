"""docs/design.md, section 1: which folder may import which. ``client/`` and ``server/`` import no
``sims``; ``scenarios/`` only the policies; ``strategies/`` nothing but itself; ``examples/`` only
the public API."""

from __future__ import annotations

import ast
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
