"""The Python workers' daemon with the routing tasks' kill point: a task killed after it
wrote its audit files.

    --set spark.options.spark.python.daemon.module=tests.reliability.worker_faults

Spark starts this module instead of ``pyspark.daemon`` (``spark.python.daemon.module``),
so every Python worker it forks has :func:`streaming.router.batch.routing.write_task_audit`
wrapped: when the file ``$BITROUTE_FAULTS/armed`` holds ``task-files worker``, the
first task that passes the point deletes it, writes ``$BITROUTE_FAULTS/fired`` and
SIGKILLs its own Python worker, after its audit files are complete and before its
result reaches Spark. Spark sees a task whose worker crashed: the files are never
committed (untracked until the maintenance's vacuum deletes them) and the batch's
routing is attempted again (by Spark on a cluster, by the router's retry in local mode).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

POINT = "task-files"


def _install(faults: Path) -> None:
    from streaming.router.batch import routing

    write = routing.write_task_audit

    def write_then_kill(routed, settings):
        row = write(routed, settings)
        armed = faults / "armed"
        try:
            wanted, target = armed.read_text().split()
        except (FileNotFoundError, ValueError):
            return row
        if wanted == POINT and target == "worker":
            armed.unlink(missing_ok=True)
            (faults / "fired").write_text(f"{POINT} worker {os.getpid()} "
                                          f"batch {settings.audit.batch_id}\n")
            os.kill(os.getpid(), signal.SIGKILL)
        return row

    routing.write_task_audit = write_then_kill


if __name__ == "__main__":
    if os.environ.get("BITROUTE_FAULTS"):
        _install(Path(os.environ["BITROUTE_FAULTS"]))
    from pyspark import daemon

    daemon.manager()
