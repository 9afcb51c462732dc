"""The command line's shared behaviour: help, version, one-line errors."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from streaming import jvm

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def test_help_lists_the_verbs(cli):
    result = cli("--help")
    assert result.returncode == 0
    for verb in ("broker", "match", "version"):
        assert verb in result.stdout


def _pinned(package: str) -> str:
    """The version pyproject.toml pins ``package`` to (``package==X``)."""
    with PYPROJECT.open("rb") as handle:
        requirements = tomllib.load(handle)["project"]["dependencies"]
    [pin] = [m.group(1) for r in requirements if (m := re.fullmatch(rf"{package}==(\S+)", r))]
    return pin


def test_version_names_the_pinned_spark(cli):
    result = cli("version")
    assert result.returncode == 0
    assert result.stdout.startswith(f"bitroute 0.1.0 (pyspark {_pinned('pyspark')}")


def test_the_spark_jars_are_those_of_the_pinned_pyspark():
    """pyspark and the Kafka connector are one release: conf/jvm.toml follows pyproject.toml."""
    spark = [a for a in jvm.coordinates("spark")["artifacts"] if a.startswith("org.apache.spark:")]
    assert spark and all(a.endswith(f":{_pinned('pyspark')}") for a in spark)


def test_bad_configuration_is_one_line_naming_the_key(cli):
    result = cli("broker", "status", "--set", "broker.port=99999")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "bitroute: error: configuration: broker.port: expected a port number 1..65535, got 99999"]
