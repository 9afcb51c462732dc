"""The router as ``benchmarks.e2e.router_probe`` runs it, plus what its driver holds, sampled.

Run by :mod:`benchmarks.soak` with ``--diagnose``: besides the ``PROBE``
line of every batch, a thread prints every ``--every`` seconds one line
``DIAG {json}`` on stdout about this process (the router's Python driver):

- ``gc``: collections per generation, objects tracked, and the ten types whose
  object count grew most since the first sample (py4j proxies, Arrow
  objects, reports... show up here when something keeps them);
- ``arrow_mb``: bytes held by Arrow's default memory pool;
- ``malloc``: glibc's ``mallinfo2`` (``arena`` + ``hblkhd`` is what malloc
  took from the OS, ``uordblks`` what is in use, ``fordblks`` free but kept:
  fragmentation shows as free bytes the process does not give back);
- with ``--tracemalloc``: Python allocations traced since the first sample, the
  ten source lines that grew most (costly: use it to find a leak, not to
  measure speed);
- with ``--trim``: ``malloc_trim(0)`` is called before sampling, and the RSS
  before and after are reported; an RSS that trimming brings back down was
  freed memory glibc kept, not a leak.

``--table-reload-commits N`` overrides how often the audit appender reloads its
Delta tables (:data:`streaming.audit.writer.TABLE_RELOAD_COMMITS`; 0: never, as
before that bound existed), for an A/B in one session.

Usage: ``python -m benchmarks.soak_probe [--every S] [--tracemalloc] [--trim]
[--table-reload-commits N] [--set section.key=value]...``; SIGTERM stops after the current batch.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import json
import os
import signal
import sys
import threading
import time
import tracemalloc

import pyarrow as pa

from benchmarks.e2e.router_probe import _print_probe, serve
from streaming.config import load, parse_set_flags
from streaming.router.service import Router

_PAGE = os.sysconf("SC_PAGE_SIZE")
MB = 1 << 20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _libc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        return libc
    except (OSError, AttributeError):
        return None


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE / MB


class Diagnostics:
    """Samples this process every ``every`` seconds in a daemon thread (module docstring)."""

    def __init__(self, every: float, trace: bool, trim: bool) -> None:
        self.every, self.trace, self.trim = every, trace, trim
        self.libc = _libc()
        self._types0: collections.Counter | None = None
        self._snap0: tracemalloc.Snapshot | None = None
        if trace:
            tracemalloc.start(1)

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True, name="soak-diagnostics").start()

    def _run(self) -> None:
        while True:
            time.sleep(self.every)
            try:
                print("DIAG " + json.dumps(self.sample()), flush=True)
            except Exception as exc:  # noqa: BLE001 - a diagnostic never stops the router
                print(f"DIAG {json.dumps({'error': repr(exc)})}", flush=True)

    def sample(self) -> dict:
        out: dict = {"t": time.time(), "rss_mb": _rss_mb()}
        if self.trim and self.libc is not None:
            self.libc.malloc_trim(0)
            out["rss_after_trim_mb"] = _rss_mb()
        objects = gc.get_objects()
        types = collections.Counter(type(o).__qualname__ for o in objects)
        del objects
        if self._types0 is None:
            self._types0 = types
        grown = (types - self._types0).most_common(10)
        out["gc"] = {"counts": gc.get_count(), "collections": [s["collections"] for s in gc.get_stats()],
                     "objects": sum(types.values()), "grown_types": grown}
        out["arrow_mb"] = pa.total_allocated_bytes() / MB
        if self.libc is not None:
            m = self.libc.mallinfo2()
            out["malloc"] = {k: getattr(m, k) / MB for k in ("arena", "hblkhd", "uordblks", "fordblks")}
        out["threads"] = threading.active_count()
        out["fds"] = len(os.listdir("/proc/self/fd"))
        if self.trace:
            snap = tracemalloc.take_snapshot()
            if self._snap0 is None:
                self._snap0 = snap
            current, _ = tracemalloc.get_traced_memory()
            out["traced_mb"] = current / MB
            out["traced_grown"] = [
                [str(s.traceback[0]), round(s.size_diff / MB, 3), s.count_diff]
                for s in snap.compare_to(self._snap0, "lineno")[:10]]
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="soak_probe")
    parser.add_argument("--config")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--every", type=float, default=30.0)
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--trim", action="store_true")
    parser.add_argument("--table-reload-commits", type=int, default=None,
                        help="override streaming.audit.writer.TABLE_RELOAD_COMMITS (0: never reload), "
                             "to compare with and without the reload in one run")
    args = parser.parse_args(argv)
    if args.table_reload_commits is not None:
        from streaming.audit import writer as delta_sink

        delta_sink.TABLE_RELOAD_COMMITS = args.table_reload_commits or sys.maxsize
    config = load(args.config, parse_set_flags(args.set))

    from streaming.cli.logs import configure_logging, quiet_kafka_client_logs
    from streaming.router.session import spark_session

    configure_logging()  # the router's logs on stderr, as `bitroute run` has them
    from streaming.router.watchdog import start_watchdog

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    diagnostics = Diagnostics(args.every, args.tracemalloc and args.every > 0, args.trim)
    spark = spark_session(config)
    quiet_kafka_client_logs(spark)
    router = Router(config, spark)
    router.report_listeners.append(_print_probe)
    t = time.time()
    router.open()
    # As `bitroute run` does: the JVM ends with this process, even after a SIGKILL.
    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    start_watchdog(jvm_pid, router.lock.fd)
    query = router.start()
    print(f"STARTED {json.dumps({'open_s': time.time() - t, 'subscriptions': len(router.subscriptions), 'version': router.subscriptions.version, 'jvm_pid': jvm_pid})}",
          flush=True)
    if args.every > 0:
        diagnostics.start()
    return serve(router, query, stop)


if __name__ == "__main__":
    sys.exit(main())
