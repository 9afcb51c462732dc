"""What a finished micro-batch did, and who hears of it: the router's report listeners.

The router builds one :class:`BatchReport` per finished batch and calls every
registered :data:`ReportListener` with it (``Router.report_listeners``), in
the batch's thread, in registration order, after the batch's audit is durable
and before Spark commits the batch. The library prints nothing for a batch;
what a report becomes is the listeners':

- ``status.json`` (:class:`StatusFile`), which the router registers first, so
  that whoever sees a batch anywhere else finds it in ``bitroute status`` too;
- the progress line on stdout (:meth:`BatchReport.line`), registered by
  ``bitroute run`` (:mod:`streaming.cli.run`);
- the Prometheus metrics (:mod:`streaming.ops.metrics`), and benchmarks' probes.

A listener that raises fails the batch like a failed step: Spark re-runs it.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from streaming.atomic import write_atomically

LATENCIES_KEPT = 10_000
"""Publishes whose end-to-end latency :class:`LatencyWindow` keeps (the latest)."""

ROUTED_IN_DRIVER = "driver"
ROUTED_IN_EXECUTORS = "executors"


@dataclass(frozen=True)
class BatchReport:
    """What one micro-batch did, with the seconds of each stage."""

    batch_id: int
    rows: int
    deliveries: int
    rejected: int
    snapshot_version: int
    seconds: float
    rerun: bool
    """The batch was pinned before: Spark runs it again after a crash, with its pinned
    snapshot version (docs/design.md, "Words")."""
    stages: dict[str, float] = field(default_factory=dict)
    attempts: int = 1
    routed_in: str = ROUTED_IN_EXECUTORS
    """Where the route stage ran: :data:`ROUTED_IN_DRIVER` or :data:`ROUTED_IN_EXECUTORS`."""
    lost: int = 0
    """Publishes Kafka deleted before the router read them, recorded with this batch
    (:mod:`streaming.router.topics.retention`)."""
    expired: int = 0
    """Publishes whose lifetime (``expiry`` header) ended before they were routed."""


class LatencyWindow:
    """The end-to-end latency of the latest :data:`LATENCIES_KEPT` publishes (publish
    timestamp to the moment their deliveries were acknowledged: a micro-batch's routing
    done, or realtime mode's routed record), for ``bitroute status`` and the metrics.
    Bounded whatever the traffic; thread-safe."""

    def __init__(self, kept: int = LATENCIES_KEPT) -> None:
        self._values: deque[float] = deque(maxlen=kept)
        self._lock = threading.Lock()

    def add(self, latencies_ms) -> None:
        """Add latencies in ms (an iterable of numbers; NaN and None are left out)."""
        values = [float(v) for v in latencies_ms if v is not None and v == v]
        with self._lock:
            self._values.extend(values)

    def percentiles(self) -> dict[str, float] | None:
        """``{"p50", "p99", "max"}`` in ms, or None before the first publish."""
        with self._lock:
            if not self._values:
                return None
            values = sorted(self._values)
        return {"p50": values[int(0.5 * (len(values) - 1))],
                "p99": values[int(0.99 * (len(values) - 1))], "max": values[-1]}


ReportListener = Callable[[BatchReport], None]
"""Called with each finished batch's report (module docstring)."""


class StatusFile:
    """``<checkpoint_dir>/router/status.json``: the last batch's report with the router's
    figures of the moment, replaced atomically; a :data:`ReportListener`.

    ``figures()`` gives what the report does not hold: ``query_id``, ``run_id``,
    ``subscriptions``, ``audit_pending_batches``, ``audit_lag_seconds``, ``lost_total``
    (publishes recorded lost to retention since the router started), ``expired_total``
    (publishes expired before they were routed, since the router started).
    Thread-safe: the batch writes it, and :meth:`refresh` rewrites it from
    the audit committer's thread (the audit figures move between batches).
    ``bitroute status`` reads it (:mod:`streaming.ops.status`).
    """

    def __init__(self, path: Path, figures: Callable[[], dict[str, object]]) -> None:
        self.path = Path(path)
        self._figures = figures
        self._lock = threading.Lock()
        self._last: tuple[BatchReport, str] | None = None

    def __call__(self, report: BatchReport) -> None:
        finished_at = datetime.now(UTC).isoformat(timespec="milliseconds")
        with self._lock:
            self._last = (report, finished_at)
            self._write(report, finished_at)

    def refresh(self) -> None:
        """Write the last report again with the figures of now (no batch yet: nothing)."""
        with self._lock:
            if self._last is not None:
                self._write(*self._last)

    def _write(self, report: BatchReport, finished_at: str) -> None:
        figures = self._figures()
        status = {
            "query_id": figures.get("query_id"),
            "run_id": figures.get("run_id"),
            "batch_id": report.batch_id,
            "publishes": report.rows,
            "deliveries": report.deliveries,
            "rejected": report.rejected,
            "lost": report.lost,
            "expired": report.expired,
            "snapshot_version": report.snapshot_version,
            "seconds": round(report.seconds, 4),
            "stages": {k: round(v, 4) for k, v in report.stages.items()},
            "routed_in": report.routed_in,
            "finished_at": finished_at,
            "subscriptions": figures.get("subscriptions", 0),
            "audit_pending_batches": figures.get("audit_pending_batches", 0),
            "audit_lag_seconds": figures.get("audit_lag_seconds", 0.0),
            "lost_total": figures.get("lost_total", 0),
            "expired_total": figures.get("expired_total", 0),
            "mode": figures.get("mode", "microbatch"),
            "latency_ms": figures.get("latency_ms"),
        }
        if "realtime" in figures:
            status["realtime"] = figures["realtime"]
        write_atomically(self.path, json.dumps(status) + "\n", durable=False)
