"""The library never imports the command line: ``streaming/cli`` sits on top of the
rest of ``streaming`` and nothing below reaches up into it.

Checked twice: statically (no import statement of a library module names
``streaming.cli``, at module level or inside a function) and at run time (a fresh
interpreter imports every library module and finds no ``streaming.cli`` module
loaded). Pure checks: no Kafka, no Spark session.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "streaming"
CLI = "streaming.cli"


def _is_cli(module: str) -> bool:
    return module == CLI or module.startswith(CLI + ".")


def _library_modules() -> list[str]:
    """Every module of ``streaming`` outside ``streaming/cli``, by dotted name."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        if not _is_cli(name):
            names.append(name)
    return names


def _imported(path: Path, module: str) -> set[str]:
    """The modules ``path``'s import statements name (relative imports resolved)."""
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def test_the_library_modules_are_found():
    modules = _library_modules()
    assert {"streaming.kafka.client_verbs", "streaming.router.service", "streaming.ops.metrics",
            "streaming.audit.queries", "streaming.kafka.clients"} <= set(modules)
    assert not any(_is_cli(m) for m in modules)


def test_no_library_module_names_the_cli_in_an_import():
    reaching = {}
    for module in _library_modules():
        path = ROOT / Path(*module.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        names = [n for n in _imported(path, module) if _is_cli(n)]
        if names:
            reaching[module] = sorted(names)
    assert reaching == {}


def test_importing_every_library_module_loads_no_cli_module():
    modules = _library_modules()
    script = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m == {CLI!r} "
        f"or m.startswith({CLI + '.'!r}))))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []
