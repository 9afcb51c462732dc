"""``bitroute run`` with kill points: the real router, killed exactly where a crash hurts most.

    python -m tests.reliability.faulty_router --faults DIR [--set section.key=value]...

runs ``streaming.cli.main main(["run", ...])`` unchanged, after wrapping a few of
the router's own methods with a check of the file ``DIR/armed``. The file holds
``<point> <target>``; the first time the router passes ``<point>`` while it
exists, the wrapper deletes it, prints ``FAULT <point> <target>`` on stdout and
sends SIGKILL to ``target``: ``group`` (the router's process group: the Python
driver, its Spark JVM and the Python workers) or ``python`` (the driver alone;
the router's watchdog then kills the JVM). Nothing else changes: with no file
the wrappers only cost a ``stat``.

Kill points (:data:`POINTS`), in the order a batch passes them:
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

POINTS = {
    "catch-up-read": "the changelog read into the in-memory index, nothing of it persisted",
    "catch-up": "a new snapshot version persisted, its subscriptions audit not appended, "
                "the batch not pinned",
    "audit": "the batch's deliveries written and acknowledged by Kafka, its audit not journaled",
    "journaled": "the batch's audit journaled, Spark's commit of the batch not written",
    "task-files": "in a routing task on the executors (target ``worker``: its Python worker "
                  "alone, through :mod:`.worker_faults`): its audit files written, its result "
                  "not returned",
    "mid-audit": "in the background committer: the messages table committed a group of "
                 "journaled batches, the deliveries table maybe not, the journal kept",
    "after-audit": "in the background committer: both audit tables committed a group, its "
                   "batches not yet removed from the journal",
    "mid-compaction": "the background maintenance 20 ms into a compaction of an audit table "
                      "(files being rewritten, the OPTIMIZE commit not written)",
    "mid-vacuum": "the background maintenance 20 ms into a vacuum (files being deleted, "
                  "the VACUUM END commit not written)",
}
__doc__ += "".join(f"\n- ``{name}``: {what};" for name, what in POINTS.items())
TARGETS = ("group", "python", "worker")
ARMED = "armed"


def arm(faults: Path, point: str, target: str = "group") -> None:
    """Arm ``point``: the next time the router passes it, ``target`` is killed."""
    if point not in POINTS or target not in TARGETS:
        raise ValueError(f"unknown kill point or target: {point!r} {target!r}")
    tmp = faults / f".{ARMED}.tmp"
    tmp.write_text(f"{point} {target}\n")
    os.replace(tmp, faults / ARMED)


def disarm(faults: Path) -> None:
    (faults / ARMED).unlink(missing_ok=True)


def _install(faults: Path) -> None:
    import threading

    from deltalake.table import DeltaTable, TableOptimizer

    from streaming.audit.committer import AuditCommitter
    from streaming.audit.writer import AuditTables
    from streaming.router.subscriptions.changelog import ChangelogReader
    from streaming.router.subscriptions.snapshots import SnapshotStore

    armed = faults / ARMED

    def maybe_kill(point: str) -> None:
        try:
            wanted, target = armed.read_text().split()
        except (FileNotFoundError, ValueError):
            return
        if wanted != point:
            return
        armed.unlink(missing_ok=True)
        print(f"FAULT {point} {target}", flush=True)
        if target == "python":
            os.kill(os.getpid(), signal.SIGKILL)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    read_to_end = ChangelogReader.read_to_end

    def read_then_kill(self, offsets, apply, *args, **kwargs):
        applied = [0]

        def counting(message):
            applied[0] += 1
            apply(message)

        result = read_to_end(self, offsets, counting, *args, **kwargs)
        if applied[0]:
            maybe_kill("catch-up-read")
        return result

    save = SnapshotStore.save

    def save_then_kill(self, snapshot, changes):
        save(self, snapshot, changes)
        if changes:
            maybe_kill("catch-up")

    submit = AuditCommitter.submit

    def kill_then_journal(self, *args, **kwargs):
        maybe_kill("audit")
        journaled = submit(self, *args, **kwargs)
        maybe_kill("journaled")
        return journaled

    append_publishes = AuditTables.append_publishes

    def commit_then_kill(self, *args, **kwargs):
        append_publishes(self, *args, **kwargs)
        maybe_kill("after-audit")

    commit_files = AuditTables._commit_files

    def commit_then_kill_one(self, name, *args, **kwargs):
        commit_files(self, name, *args, **kwargs)
        if name == "messages":
            maybe_kill("mid-audit")

    def killed_within(point: str, call):
        # The step is one call into delta-rs: a timer thread kills while it runs.
        def wrapper(*args, **kwargs):
            if kwargs.get("dry_run", False) is True:
                return call(*args, **kwargs)
            timer = threading.Timer(0.02, maybe_kill, (point,))
            timer.daemon = True
            timer.start()
            try:
                return call(*args, **kwargs)
            finally:
                timer.cancel()
        return wrapper

    # The kill points, patched into the classes (what mypy calls assigning to a method).
    TableOptimizer.compact = killed_within("mid-compaction", TableOptimizer.compact)  # type: ignore[method-assign]
    DeltaTable.vacuum = killed_within("mid-vacuum", DeltaTable.vacuum)  # type: ignore[method-assign]
    ChangelogReader.read_to_end = read_then_kill  # type: ignore[method-assign]
    SnapshotStore.save = save_then_kill  # type: ignore[method-assign]
    AuditCommitter.submit = kill_then_journal  # type: ignore[method-assign]
    AuditTables.append_publishes = commit_then_kill  # type: ignore[method-assign]
    AuditTables._commit_files = commit_then_kill_one  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or argv[0] != "--faults":
        print("usage: python -m tests.reliability.faulty_router --faults DIR "
              "[--set section.key=value]...", file=sys.stderr)
        return 2
    faults = Path(argv[1])
    faults.mkdir(parents=True, exist_ok=True)
    _install(faults)
    # The routing tasks' kill point lives in the Python workers (worker_faults), which
    # find the folder here; Spark starts them from the driver's environment.
    os.environ["BITROUTE_FAULTS"] = str(faults.absolute())
    from streaming.cli.main import main as bitroute

    return bitroute(["run", *argv[2:]])


if __name__ == "__main__":
    sys.exit(main())
