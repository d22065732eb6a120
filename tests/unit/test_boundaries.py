"""The rooms of the code base: what the engine may import, and how big a module may grow.

runtime/ is the engine. It sees the ``Bus`` and ``Store`` protocols it defines; only
the composition root (the CLI and the node wiring) knows the gateway, the Postgres
store, the demo and the examples (STYLE.md 13, issue 11 item 6). Modules hold one
concept each and are split past ~500 lines (STYLE.md 1).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "runtime"

# Packages the engine must not import (the bare folder names too: with the checkout on
# sys.path, as under pytest, `import store` would work here and fail in an installed wheel).
FORBIDDEN = (
    "signoff.gateway",
    "signoff.store",
    "signoff.embedded",
    "signoff.demo",
    "examples",
    "gateway",
    "store",
    "embedded",
)

# The composition root: the only runtime modules that wire everything together.
# The command line's commands live in modules of their own (runtime/cli_*.py), registered
# from cli.py: they are the composition root as much as cli.py is.
COMPOSITION_ROOT = frozenset(
    {
        "runtime/cli.py",
        "runtime/node.py",
        "runtime/cli_cards.py",
        "runtime/cli_ops.py",
        "runtime/cli_prune.py",
        "runtime/cli_runs.py",
        "runtime/cli_token.py",
        "runtime/cli_clean.py",
    }
)

# Known offenders: none since the Store protocol (runtime/store.py) landed.
KNOWN_OFFENDERS: frozenset[str] = frozenset()

MAX_LINES = 500
SOURCE_ROOTS = ("signoff", "runtime", "gateway", "store", "embedded")
# Modules over MAX_LINES, each with the reason it is still allowed (none today).
TOO_LONG_ALLOWED: set[str] = set()


def module_name(path: Path) -> str:
    """``runtime/bus/redis.py`` -> ``signoff.runtime.bus.redis`` (a package: its __init__)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["signoff", *parts])


def imported_modules(source: str, module: str, *, is_package: bool = False) -> set[str]:
    """Every module ``source`` (the text of ``module``) imports, anywhere in it (lazy
    imports in functions too), relative imports resolved; ``from a import b`` yields
    ``a`` and ``a.b``."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join([*base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)
    return found


def forbidden(names: set[str]) -> list[str]:
    return sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in FORBIDDEN))


def forbidden_imports(path: Path) -> list[str]:
    names = imported_modules(
        path.read_text(), module_name(path), is_package=path.name == "__init__.py"
    )
    return forbidden(names)


def runtime_modules() -> list[Path]:
    return sorted(p for p in RUNTIME.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_import_check_sees_lazy_relative_and_from_imports() -> None:
    source = (
        "def f():\n"
        "    from signoff.store.postgres import PostgresStore\n"
        "from ... import demo\n"
        "from .. import bus\n"
        "from signoff import gateway\n"
        "import examples.payments\n"
        "from signoff.runtime.bus import Bus\n"
    )
    names = imported_modules(source, "signoff.runtime.models.probe")
    assert "signoff.runtime.bus" in names
    assert forbidden(names) == [
        "examples.payments",
        "signoff.demo",
        "signoff.gateway",
        "signoff.store.postgres",
        "signoff.store.postgres.PostgresStore",
    ]
    assert forbidden(imported_modules("from . import x", "signoff.runtime", is_package=True)) == []
    assert module_name(RUNTIME / "bus" / "__init__.py") == "signoff.runtime.bus"


def test_the_engine_imports_no_gateway_store_demo_or_examples() -> None:
    offenders = {
        str(path.relative_to(ROOT)): forbidden_imports(path)
        for path in runtime_modules()
        if str(path.relative_to(ROOT)) not in COMPOSITION_ROOT
    }
    offenders = {name: found for name, found in offenders.items() if found}
    unexpected = {name: found for name, found in offenders.items() if name not in KNOWN_OFFENDERS}
    assert unexpected == {}, "runtime/ must reach these through protocols or the composition root"
    cleaned = sorted(KNOWN_OFFENDERS - set(offenders))
    assert cleaned == [], "no longer an offender: take it off KNOWN_OFFENDERS"


def test_the_composition_root_exists() -> None:
    for name in COMPOSITION_ROOT:
        assert (ROOT / name).is_file(), name


def source_modules() -> list[Path]:
    found: list[Path] = []
    for root in SOURCE_ROOTS:
        for path in (ROOT / root).rglob("*.py"):
            # signoff/runtime, signoff/gateway and signoff/store are links to the folders
            # counted on their own.
            inside = path.relative_to(ROOT).parents
            if "__pycache__" in path.parts or any((ROOT / p).is_symlink() for p in inside):
                continue
            found.append(path)
    return sorted(found)


def test_no_source_module_is_over_500_lines() -> None:
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in source_modules()
    }
    assert "runtime/agent.py" in sizes and "signoff/__init__.py" in sizes
    too_long = {name: n for name, n in sizes.items() if n > MAX_LINES}
    unexpected = {name: n for name, n in too_long.items() if name not in TOO_LONG_ALLOWED}
    assert unexpected == {}, f"split these below {MAX_LINES} lines"
    cleaned = sorted(TOO_LONG_ALLOWED - set(too_long))
    assert cleaned == [], "now short enough: take it off TOO_LONG_ALLOWED"


def test_the_bus_protocol_loads_no_redis_code() -> None:
    """Gateways, workers and tests on the in-process bus need no Redis client loaded."""
    probe = (
        "import sys; import signoff.runtime.bus, signoff.runtime.bus.memory; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('redis', 'hiredis')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
