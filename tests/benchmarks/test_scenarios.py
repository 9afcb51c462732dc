"""Every benchmark scenario runs, at toy size (``python -m benchmarks <scenario> --smoke``).

Not a timing test: it asserts that each scenario still runs end to end on today's
code and prints its figures and the machine lines, so that a refactor that breaks a
scenario fails CI the day it breaks. Each scenario starts what it needs (``bitroute
run``, Spark) in a process of its own and stops it, bounded by :data:`TIMEOUT_S`; the
broker is the session's (``--bootstrap``, each scenario's topics named apart), since
starting one per scenario was a large part of the smoke runs' time, and every JVM a
scenario starts runs with ``short_jvm.SHORT_JVM`` (docs/benchmarks.md, the smoke run in CI).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import SCENARIOS
from short_jvm import short_jvm_options
from streaming import kafka
from waiting import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300
#: A line each scenario prints only once it measured something.
FIGURE = {
    "compiler": "| bitroute |",
    "route-task": "deliveries/s",
    "batch-cycle": "| route |",
    "e2e": "bitroute: 90% ->",
    "soak": "RSS",
    "audit-week": "batches",
    "audit-write": "delta-spark / task-files",
    "audit-read": "rows",
    "subscriber-scale": "subscribers",
    "driver-cost": "after",
    "replay": "live p99 with / without a replay",
    "pack-start": "build (cached)",
    "retained-match": "| `+/+/m3` |",
    "subscribe-latency": "subscribe-ack to delivery",
    "passthrough": "| Spark copy, realtime |",
}


def run_benchmarks(*args: str, tmp: Path | None = None,
                   timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks *args`` from the checkout, its JVMs with ``short_jvm.SHORT_JVM``;
    its temporary folders (the scenarios' work folders among them) under ``tmp``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        JAVA_TOOL_OPTIONS=short_jvm_options())
    if tmp is not None:
        env["TMPDIR"] = str(tmp)
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_the_list_names_every_scenario_and_an_unknown_one_is_refused():
    listed = run_benchmarks("--list", timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()] == list(SCENARIOS)
    assert set(FIGURE) == set(SCENARIOS)
    unknown = run_benchmarks("no-such-scenario", timeout=60)
    assert unknown.returncode == 2
    assert "unknown scenario 'no-such-scenario'" in unknown.stderr
    no_scenario = run_benchmarks("--bootstrap", "127.0.0.1:9092", timeout=60)
    assert no_scenario.returncode == 2
    assert "--bootstrap takes HOST:PORT, then the scenario" in no_scenario.stderr


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_each_scenario_runs_at_toy_size(scenario: str, tmp_path: Path, kafka_bootstrap: str):
    done = run_benchmarks("--bootstrap", kafka_bootstrap, scenario, "--smoke", tmp=tmp_path)
    assert done.returncode == 0, f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
    assert "machine before: loadavg" in done.stdout and "machine after: loadavg" in done.stdout
    assert FIGURE[scenario] in done.stdout, done.stdout[-4000:]
    if scenario == "passthrough":  # both copies measured: a row of no delivery is a failure
        rows = re.findall(r"^\| Spark copy, (\w+) \| ([\d,]+) \|", done.stdout, re.M)
        assert sorted(mode for mode, _ in rows) == ["microbatch", "realtime"], done.stdout[-4000:]
        assert all(int(n.replace(",", "")) > 0 for _, n in rows), done.stdout[-4000:]
    # On the shared broker, the scenario's topics (bench-<pid>-<time>.*) are gone after it.
    admin = kafka.admin(kafka.ClientSettings.of(kafka_bootstrap))
    wait_until(lambda: not [t for t in admin.list_topics(timeout=30).topics
                            if t.startswith("bench-")],
               f"{scenario}'s topics deleted from the shared broker", timeout=60)
