"""Run the router as ``bitroute run`` does, with the per-batch time split measured.

The router prints one progress line per batch (id, publishes, deliveries,
rejected, version, duration) but no split of that duration. This wrapper runs
the same :class:`streaming.router.Router` in its own process and times, from
outside the router's code, the calls each batch makes:

- ``catch_up``: ``Subscriptions.catch_up`` (read the changelog to its end,
  compile, snapshot, persist, audit the changes);
- ``kafka``: ``sinks.write_kafka`` (explode + the Kafka batch write, acked);
- ``delta``: ``AuditTables.append_deliveries`` + ``append_messages``;
- ``match``: the rest of the batch: read the publishes from Kafka, mapInPandas
  matching, persist and count (Spark evaluates them together).

Each batch prints ``PROBE {json}`` on stdout. Usage:
``python -m benchmarks.e2e.router_probe [--config FILE] [--set section.key=value]...``;
SIGTERM stops after the current batch.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time

from streaming import sinks
from streaming.changelog import Subscriptions
from streaming.config import load, parse_set_flags
from streaming.delta_sink import AuditTables
from streaming.router import Router

_spans: dict[str, list[tuple[float, float]]] = {}


def _timed(name: str, fn):
    def wrapper(*args, **kwargs):
        t = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            _spans.setdefault(name, []).append((t, time.monotonic()))
    return wrapper


def _wall(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by ``spans`` (the two audit appends run concurrently)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="router_probe")
    parser.add_argument("--config")
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args(argv)
    config = load(args.config, parse_set_flags(args.set))

    Subscriptions.catch_up = _timed("catch_up", Subscriptions.catch_up)
    sinks.write_kafka = _timed("kafka", sinks.write_kafka)
    AuditTables.append_deliveries = _timed("delta", AuditTables.append_deliveries)
    AuditTables.append_messages = _timed("delta", AuditTables.append_messages)
    process = Router._process

    def probed(self, batch, batch_id):
        _spans.clear()
        t = time.monotonic()
        report = process(self, batch, batch_id)
        total = time.monotonic() - t
        split = {name: _wall(spans) for name, spans in _spans.items()}
        split["match"] = total - sum(split.values())
        print("PROBE " + json.dumps({"batch": batch_id, "rows": report.rows,
                                     "deliveries": report.deliveries, "version": report.snapshot_version,
                                     "seconds": total, "end": time.time(), **split}), flush=True)
        return report

    Router._process = probed

    from streaming.session import spark_session

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    spark = spark_session(config)
    router = Router(config, spark)
    t = time.time()
    query = router.start()
    print(f"STARTED {json.dumps({'open_s': time.time() - t, 'subscriptions': len(router.subscriptions), 'version': router.subscriptions.version})}",
          flush=True)
    while not stop.is_set() and not query.awaitTermination(0.5):
        pass
    if stop.is_set():
        router.stop_after_current_batch()
        return 0
    router.stop()
    print(f"router query ended: {query.exception()}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
