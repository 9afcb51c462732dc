"""The measuring parts of benchmarks/driver_cost.py: the fan-out workload and the CPU timeline."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from benchmarks.driver_cost import CpuTimeline, descendants, fanout_workload, thread_cpu
from benchmarks.e2e import procstat
from benchmarks.workload import match_stats
from waiting import wait_until


def test_every_publish_of_the_workload_makes_exactly_fanout_deliveries():
    w = fanout_workload(subscribers=200, fanout=10, publishes=3000)
    assert len(w.subscribers) == 200 and len(w.publishes) == 3000
    matched, distinct = match_stats(w, sample=3000)
    assert (matched, distinct) == (10.0, 10.0)
    # Both filter forms are used: the '#' and the '+' paths of the matcher are exercised.
    assert {f.split("/", 1)[1] for _, _, f in w.subs} == {"#", "+/+"}


def test_the_timeline_counts_a_child_process_cpu_between_two_instants(tmp_path):
    done = tmp_path / "done"
    burner = subprocess.Popen([sys.executable, "-c",
                               "import pathlib, sys, time\nt = time.process_time()\n"
                               "while time.process_time() - t < 1.0: pass\n"
                               "pathlib.Path(sys.argv[1]).touch()\ntime.sleep(60)", str(done)])
    try:
        timeline = CpuTimeline({"burner": lambda tree: [burner.pid],
                                "nobody": lambda tree: descendants(tree, burner.pid)},
                               interval=0.05).start()
        start = time.time()
        before = procstat.cpu_seconds(burner.pid)  # its start, not counted
        wait_until(done.exists, "the burner's second of CPU", timeout=120)
        time.sleep(0.2)  # a sample after it
        end = time.time()
        timeline.stop()
        spent = timeline.between(start, end)
        total = procstat.cpu_seconds(burner.pid)
        assert 1.0 - before - 0.02 <= spent["burner"] <= total + 0.02, (spent, before, total)
        assert spent["nobody"] == 0.0
        # Nothing is counted before the first sample.
        assert timeline.between(start - 10, start - 5)["burner"] == 0.0
    finally:
        burner.kill()
        burner.wait()


def test_thread_cpu_names_this_process_threads_without_their_numbers():
    names = thread_cpu(os.getpid())
    assert names and all(not any(c.isdigit() for c in n) for n in names)
