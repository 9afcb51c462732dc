"""The executors' packed environment (streaming/pack.py, `bitroute pack`): what is in
it, that it is reused until what goes in changes, and when a session uses it.

The archive is the real one, in bitroute's cache (the standalone-cluster tests
of cli/test_run.py route through the same archive).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from streaming import pack
from streaming.session import executor_python


@pytest.fixture(scope="module")
def packed_json() -> dict:
    """`bitroute pack --json`, as a user runs it (stdout is only JSON)."""
    result = subprocess.run([str(Path(sys.executable).parent / "bitroute"), "pack", "--json"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_bitroute_pack_packs_bitroute_its_kernel_and_dependencies_without_pyspark(packed_json):
    archive = Path(packed_json["archive"])
    assert archive.is_file() and archive.stat().st_size == packed_json["size_bytes"]
    site = f"lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers()}
    tops = {name[len(site) + 1:].split("/")[0] for name in members if name.startswith(site + "/")}
    assert {"streaming", "compiler", "schemas", "conf", "bitroute_kernel", "pyarrow",
            "pandas", "numpy", "deltalake", "confluent_kafka"} <= tops
    assert f"{site}/streaming/pack.py" in members and f"{site}/conf/bitroute.toml" in members
    # Driver-only: the workers take pyspark and py4j from the cluster's Spark.
    assert not {"pyspark", "py4j", "delta"} & tops, tops & {"pyspark", "py4j", "delta"}
    assert not [name for name in members if "/tests/" in name]
    python = members["bin/python"]
    assert python.issym() and python.linkname == pack.base_interpreter()
    assert "include-system-site-packages = false" in tar_text(archive, "pyvenv.cfg")
    settings = packed_json["spark"]
    assert settings["spark.archives"] == f"{archive}#bitroute-env"
    assert settings["spark.pyspark.python"] == "./bitroute-env/bin/python"
    # The driver keeps the interpreter of bitroute's environment (the command's).
    assert Path(settings["spark.pyspark.driver.python"]).parent == Path(sys.executable).parent


def tar_text(archive: Path, name: str) -> str:
    with tarfile.open(archive) as tar:
        member = tar.extractfile(name)
        assert member is not None, f"{name} is not a file of {archive}"
        return member.read().decode()


def test_the_archive_is_reused_until_what_goes_in_it_changes(packed_json, tmp_path: Path):
    again = pack.archive()
    assert not again.built and str(again.path) == packed_json["archive"]
    distributions = pack._distributions()
    sources = pack._package_files()
    changed = tmp_path / "routing.py"
    changed.write_text("# changed\n")
    assert pack._digest(distributions, sources) == pack._digest(distributions, sources)
    assert pack._digest(distributions, [*sources[:-1], (changed, sources[-1][1])]) \
        != pack._digest(distributions, sources)


def test_a_cluster_master_ships_it_unless_the_executors_python_is_chosen(packed_json):
    assert executor_python("local[2]", {}) == {}
    assert executor_python("local-cluster[2,1,1024]", {}) == {}
    assert executor_python("spark://h:7077", {"spark.pyspark.python": "/opt/py"}) == {}
    assert executor_python("yarn", {"spark.archives": "env.tar.gz#env"}) == {}
    assert executor_python("spark://h:7077", {}) == {
        "spark.archives": f"{packed_json['archive']}#bitroute-env",
        "spark.pyspark.python": "./bitroute-env/bin/python",
        "spark.pyspark.driver.python": sys.executable,
    }
    assert executor_python("yarn", {})["spark.pyspark.python"] == "./bitroute-env/bin/python"
