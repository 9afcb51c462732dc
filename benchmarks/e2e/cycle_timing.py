"""The batch cycle timed from inside: what :mod:`benchmarks.e2e.batch_cycle` reads.

Used by ``router_probe --timings DIR`` (never by the router itself):

- :class:`TimedRouter`: the router, with ``DIAG`` lines on stdout of kind
  ``batch`` (the whole ``foreachBatch`` call, wall clock, and the report
  listeners' share) and, from a :class:`SparkProgress` query listener, kind
  ``spark`` (Spark's own ``durationMs`` of each micro-batch: latestOffset,
  getBatch, queryPlanning, addBatch, walCommit, commitOffsets,
  triggerExecution, and the trigger's start);
- :class:`TimedRoutePartitions`: the routing function of a batch, wrapped; in
  each process that runs it (a Python worker, or the driver for a small batch)
  it appends one JSON line per call to ``DIR/route-<pid>.jsonl``: when the
  call started and ended (epoch seconds, comparable across the processes of
  one machine), the matcher's load, and per Arrow batch the wait for its rows
  and the routing steps (plan = read + match + validate, records = build the
  Kafka records, produce = hand them to librdkafka, flush = wait for the acks,
  rows = the result rows).

The wrappers add a ``time.time()`` pair per step and per Arrow batch, nothing
per record.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.streaming.listener import StreamingQueryListener

from streaming.router import routing
from streaming.router.delivery import cached_producer
from streaming.router.matching import cached_matcher
from streaming.router.service import Router

_steps = threading.local()
_instrumented = False


def _timed(name: str, function):
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            record = getattr(_steps, "record", None)
            if record is not None:
                record[name] = record.get(name, 0.0) + time.perf_counter() - t
    return wrapper


def _instrument() -> None:
    """Wrap routing's steps in this process, once (route_batch finds them by module name)."""
    global _instrumented
    if _instrumented:
        return
    routing.plan_batch = _timed("plan", routing.plan_batch)
    routing.delivery_records = _timed("records", routing.delivery_records)
    routing._routed_rows = _timed("rows", routing._routed_rows)
    _instrumented = True


class TimedRoutePartitions:
    """:class:`streaming.router.routing.RoutePartitions`, timed (see module docstring)."""

    def __init__(self, inner: routing.RoutePartitions, batch_id: int, folder: str) -> None:
        self.inner = inner
        self.batch_id = batch_id
        self.folder = folder

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        started = time.time()
        _instrument()
        inner = self.inner
        t = time.perf_counter()
        matcher = cached_matcher(inner._key, lambda: inner._broadcast.value)
        producer = cached_producer(inner.settings.producer)
        if not getattr(producer, "_timed", False):
            producer.produce_many = _timed("produce", producer.produce_many)
            producer.flush = _timed("flush", producer.flush)
            producer._timed = True
        loaded = time.perf_counter() - t
        calls = []
        source = iter(batches)
        while True:
            t = time.perf_counter()
            batch = next(source, None)
            waited = time.perf_counter() - t
            if batch is None:
                break
            _steps.record = record = {"rows_in": batch.num_rows, "wait_in": waited}
            t = time.perf_counter()
            out = routing.route_safely(matcher, producer, batch, inner.settings)
            record["route"] = time.perf_counter() - t
            _steps.record = None
            calls.append(record)
            t = time.perf_counter()
            yield out
            record["wait_out"] = time.perf_counter() - t
        line = {"batch": self.batch_id, "pid": os.getpid(), "start": started, "end": time.time(),
                "matcher": loaded, "calls": calls}
        with open(Path(self.folder) / f"route-{os.getpid()}.jsonl", "a") as out_file:
            out_file.write(json.dumps(line) + "\n")


def _diag(kind: str, **fields: Any) -> None:
    print("DIAG " + json.dumps({"kind": kind, **fields}), flush=True)


class TimedRouter(Router):
    """The router, its ``foreachBatch`` and its routing function timed (module docstring)."""

    def __init__(self, *args, timings: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.timings = timings
        self._batch_id = -1

    def open(self) -> None:
        super().open()
        # The pin stage's parts: the changelog's end offsets and read, the pin's
        # fsync, the pruning of old pins.
        self._parts: dict[str, float] = {}
        sync, store = self.subscription_sync, self._snapshots._store
        sync.catch_up = self._part("changelog", sync.catch_up)
        store.pin = self._part("pin", store.pin)
        store.prune = self._part("prune", store.prune)
        self._committer.submit = self._part("journal", self._committer.submit)

    def _part(self, name: str, function):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self._parts[name] = self._parts.get(name, 0.0) + time.perf_counter() - t
        return wrapper

    def _process(self, batch, batch_id: int):
        self._batch_id = batch_id
        self._parts = {}
        start = time.time()
        report = super()._process(batch, batch_id)
        end = time.time()
        _diag("batch", batch=batch_id, start=start, end=end,
              report=(end - start) - report.seconds, routed_in=report.routed_in,
              parts=self._parts)
        return report

    if os.environ.get("BATCH_CYCLE_DRIVER_CALLS") == "per-partition":
        # The driver path before issue 22's batch-cycle change, for an A/B in one run:
        # a routing call (and a flush) per record batch toArrow hands back.
        @staticmethod
        def _route_in_driver(source, route):
            return pa.Table.from_batches(route(iter(source.toArrow().to_batches())),
                                         routing.ROUTED_ARROW)

    def _route_function(self, snapshot):
        return TimedRoutePartitions(super()._route_function(snapshot), self._batch_id,
                                    self.timings)


class SparkProgress(StreamingQueryListener):
    """Prints Spark's own timings of every micro-batch (``DIAG`` kind ``spark``)."""

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 (pyspark's names)
        pass

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        p = event.progress
        try:
            _diag("spark", batch=p.batchId, timestamp=p.timestamp, rows=p.numInputRows,
                  durations=dict(p.durationMs))
        except Exception as exc:  # noqa: BLE001 - a probe: say it, go on
            print(f"progress not printed: {exc!r}", file=sys.stderr)

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        pass


def read_route_timings(folder: Path) -> dict[int, list[dict]]:
    """Batch id -> the timed routing calls of that batch (every process's)."""
    out: dict[int, list[dict]] = {}
    for path in sorted(Path(folder).glob("route-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                out.setdefault(record["batch"], []).append(record)
    return out
