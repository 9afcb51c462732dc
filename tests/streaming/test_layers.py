"""The layers of ``streaming/``: which packages may import which, read from the source.

Every import counts, the ones inside functions too: a late import is still a
dependency, and a cycle through one is still a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

STREAMING = Path(__file__).resolve().parents[2] / "streaming"

BELOW_THE_ROUTER = ("streaming.audit", "streaming.state", "streaming.session")
"""Packages the router uses (the session through ``bitroute run``), which must not import it."""


def _package(module: str) -> str:
    """``streaming.router.batch.routing`` -> ``streaming.router``; a top-level module is its own."""
    return ".".join(module.split(".")[:2])


def _imports(path: Path) -> list[str]:
    """Every absolute module path ``path`` imports, with each name of a ``from`` import
    joined to it (``from streaming import router`` imports ``streaming.router``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return found


def _module(path: Path) -> str:
    parts = path.relative_to(STREAMING.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports_of(package: str) -> dict[str, list[str]]:
    """``{module of package: [streaming modules it imports outside package]}``."""
    found = {}
    for path in sorted(STREAMING.rglob("*.py")):
        module = _module(path)
        if _package(module) != package:
            continue
        outside = [name for name in _imports(path)
                   if name.startswith("streaming.") and _package(name) != package]
        if outside:
            found[module] = outside
    return found


def test_the_parser_sees_late_imports_and_from_package_imports(tmp_path):
    source = tmp_path / "x.py"
    source.write_text("from streaming import router\n\ndef f():\n    import streaming.audit.sql\n")
    assert set(_imports(source)) == {"streaming", "streaming.router", "streaming.audit.sql"}


def test_the_router_imports_the_packages_below_it():
    """The rule below is checked against real edges (it would pass vacuously otherwise)."""
    imported = {_package(name) for names in _imports_of("streaming.router").values() for name in names}
    assert {"streaming.audit", "streaming.state"} <= imported


def test_no_package_below_the_router_imports_it():
    """audit/, state/ and the Spark session never import router/: the state folder's
    ownership (streaming/state/) is shared by both, so no cycle runs through the router."""
    back = {module: [name for name in names if _package(name) == "streaming.router"]
            for package in BELOW_THE_ROUTER for module, names in _imports_of(package).items()}
    assert {module: names for module, names in back.items() if names} == {}
