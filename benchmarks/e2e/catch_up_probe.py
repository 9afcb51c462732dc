"""The changelog catch-up of a batch, with and without new subscription changes.

    python -m benchmarks.e2e.catch_up_probe [--rounds 5] [--changes 1,50]

Every batch first reads the changelog up to its end offsets
(:meth:`streaming.router.changelog.ChangelogReader.read_to_end`). This times
that read against an embedded broker of its own: right after ``changes`` new
records were written, then again with nothing new, for two readers in turn
each round: ``before`` (``consume`` waiting 0.5 s, the consumer's
``fetch.wait.max.ms`` Kafka's 500 ms) and ``now`` (this module's settings).
Prints the medians (ms) and the load average. Bound it with ``timeout``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from streaming import kafka
from streaming.config import load, parse_set_flags
from streaming.kafka.broker import EmbeddedBroker, free_port
from streaming.kafka.topics import ensure_router_topics
from streaming.router import changelog


def _reader(config, poll_timeout_s: float, fetch_wait_ms: int):
    """A reader whose consume wait and fetch wait are the given ones."""
    saved = changelog._FETCH_WAIT_MS
    changelog._FETCH_WAIT_MS = fetch_wait_ms
    try:
        return changelog.ChangelogReader(config), poll_timeout_s
    finally:
        changelog._FETCH_WAIT_MS = saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="catch_up_probe")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--changes", default="1,50")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.changes.split(",")]
    now_poll = changelog._POLL_TIMEOUT_S
    with tempfile.TemporaryDirectory() as folder:
        broker = EmbeddedBroker(Path(folder), "127.0.0.1", free_port(), free_port())
        broker.start()
        try:
            config = load(None, parse_set_flags([f"kafka.bootstrap={broker.bootstrap}",
                                                 "broker.embedded=false"]))
            ensure_router_topics(config)
            producer = kafka.producer(config.kafka.client_settings, {"linger.ms": 0})
            readers = {"before": _reader(config, 0.5, 500),
                       "now": _reader(config, now_poll, changelog._FETCH_WAIT_MS)}
            offsets = {name: readers[name][0].read_to_end({}, lambda m: None) for name in readers}
            times: dict[tuple[str, int, str], list[float]] = {}
            value = json.dumps({"exchange": "mqtt", "subscriber": "s", "filter": "a/b"}).encode()
            for r in range(args.rounds):
                for n in sizes:
                    for i in range(n):
                        producer.produce(config.kafka.subscriptions_topic, value, f"k{i}".encode())
                    producer.flush(30)
                    for name in (["before", "now"] if r % 2 else ["now", "before"]):
                        reader, poll = readers[name]
                        changelog._POLL_TIMEOUT_S = poll
                        for case in ("new", "none new"):
                            t = time.perf_counter()
                            offsets[name] = reader.read_to_end(offsets[name], lambda m: None)
                            times.setdefault((name, n, case), []).append(time.perf_counter() - t)
                changelog._POLL_TIMEOUT_S = now_poll
            print(f"medians of {args.rounds} rounds (ms); load average "
                  f"{'/'.join(f'{x:.1f}' for x in os.getloadavg())}")
            print("| changes | reader | read with the new changes | read with none new |")
            print("| ---: | --- | ---: | ---: |")
            for n in sizes:
                for name in ("before", "now"):
                    print(f"| {n} | {name} | {1000 * statistics.median(times[(name, n, 'new')]):,.0f} "
                          f"| {1000 * statistics.median(times[(name, n, 'none new')]):,.0f} |")
        finally:
            broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
