"""The command line's shared behaviour: help, version, one-line errors."""

from __future__ import annotations

import subprocess
import sys


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streaming.cli", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_help_lists_the_verbs():
    result = _run("--help")
    assert result.returncode == 0
    for verb in ("broker", "match", "version"):
        assert verb in result.stdout


def test_version_names_the_pinned_spark():
    result = _run("version")
    assert result.returncode == 0
    assert result.stdout.startswith("bitroute 0.1.0 (pyspark 4.0.0")


def test_bad_configuration_is_one_line_naming_the_key():
    result = _run("broker", "status", "--set", "broker.port=99999")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "bitroute: error: configuration: broker.port: expected a port number 1..65535, got 99999"]
