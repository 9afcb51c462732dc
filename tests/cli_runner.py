"""The ``bitroute`` command line as users run it: a child process of this Python, its exit
status and its two streams captured.

conftest.py's ``cli`` fixture is this function; module-scope fixtures call it directly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from short_jvm import short_jvm_env

CLI_TIMEOUT_S = 120.0  # a bound, not an expectation


def set_flags(settings: Mapping[str, str]) -> list[str]:
    """``settings`` as ``--set key=value`` flags."""
    return [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]


def run_cli(*args: str, settings: Mapping[str, str] | None = None,
            env: Mapping[str, str] | None = None, cwd: Path | str | None = None,
            timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run ``bitroute ARGS`` (``settings`` as ``--set`` flags after them) and return the
    finished process, ``stdout`` and ``stderr`` as text. ``env`` replaces the
    environment when given; either way a JVM the verb starts (``bitroute sql``) gets
    ``short_jvm.SHORT_JVM``."""
    command = [sys.executable, "-m", "streaming.cli.main", *args, *set_flags(settings or {})]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env=short_jvm_env(os.environ if env is None else env), cwd=cwd)
