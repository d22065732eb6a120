"""The engine depends on the runtime's ``Store`` protocol, not on the Postgres store: under
runtime/ only the composition root imports ``signoff.store`` or ``signoff.embedded``."""

from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
# The command line's commands (runtime/cli_*.py) are part of it, like cli.py.
COMPOSITION_ROOT = {
    "cli.py",
    "node.py",
    "cli_cards.py",
    "cli_ops.py",
    "cli_prune.py",
    "cli_runs.py",
    "cli_token.py",
    "cli_clean.py",
}
BACKENDS = ("signoff.store", "signoff.embedded")


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def backend_imports(path: Path) -> list[str]:
    return sorted(
        name
        for name in imported_modules(path)
        if any(name == b or name.startswith(b + ".") for b in BACKENDS)
    )


def test_only_the_composition_root_imports_the_store() -> None:
    modules = sorted(RUNTIME.rglob("*.py"))
    assert len(modules) > 20
    offenders = {
        str(m.relative_to(RUNTIME)): backend_imports(m)
        for m in modules
        if m.name not in COMPOSITION_ROOT or m.parent != RUNTIME
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_check_sees_an_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from signoff import store\nimport signoff.embedded.postgres\n")
    assert backend_imports(module) == ["signoff.embedded.postgres", "signoff.store"]
