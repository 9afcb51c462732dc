"""One campaign run's world: Kafka (1 or 3 brokers), the router's settings, the
subscriptions on the changelog, the router, publishing into a ledger, and the
final read of every output.

A :class:`Stage` is a context manager: leaving it (also on an exception or
Ctrl-C) kills the router and stops every broker it started.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
from confluent_kafka import Producer
from confluent_kafka.admin import ConfigResource

from schemas.records import message_id
from streaming import kafka
from streaming.config import Config, load
from streaming.kafka.topics import ensure_router_topics
from tests.reliability.cluster import Kafka
from tests.reliability.kafka_io import (
    MICROBATCH,
    REALTIME,
    CampaignError,
    Publisher,
    Record,
    lag,
    producer,
    wait_audited,
    wait_routed,
)
from tests.reliability.ledger import Ledger
from tests.reliability.outputs import (
    Rejections,
    read_audit,
    read_deliveries,
    read_rejected,
    repeated_subscription_rows,
    subscription_rows,
)
from tests.reliability.router import Router
from tests.reliability.workload import A_VALUES, B_VALUES, EXCHANGES, Publish, Workload

_EXCHANGE_LIST = sorted(EXCHANGES)
REALTIME_SETTINGS = {
    "streaming.mode": REALTIME,
    # Real-Time Mode holds a task slot per publishes partition, and the audit query one
    # more: local[2] routes one partition.
    "kafka.partitions": "1",
    "audit.commit_interval": "1 second",
}
"""The router's settings of a campaign run in realtime mode (``Options.mode``)."""


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def encode(p: Publish) -> int:
    """A publish as one small int (the ledger of a million publishes stays an array)."""
    return ((_EXCHANGE_LIST.index(p.exchange) * A_VALUES + p.a) * B_VALUES + p.b) * 2 + p.gold


def decode(code: int) -> Publish:
    code, gold = divmod(code, 2)
    code, b = divmod(code, B_VALUES)
    exchange, a = divmod(code, A_VALUES)
    return Publish(_EXCHANGE_LIST[exchange], a, b, bool(gold))


class Stage:
    """Kafka + settings + router in ``folder`` for one case; ``mode``: the router's
    ``streaming.mode`` (:data:`REALTIME_SETTINGS` in realtime mode)."""

    def __init__(self, folder: Path, brokers: int = 1, settings: dict[str, str] | None = None,
                 log: Callable[[str], None] | None = None, bootstrap: str | None = None,
                 mode: str = MICROBATCH) -> None:
        if mode not in (MICROBATCH, REALTIME):
            raise ValueError(f"unknown mode {mode!r}")
        self.mode = mode
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.kafka = Kafka(self.folder, brokers) if bootstrap is None else None
        self.bootstrap = bootstrap
        self.extra = {**(REALTIME_SETTINGS if mode == REALTIME else {}), **(settings or {})}
        self.log = log or _log
        self.settings: dict[str, str] = {}
        self._config: Config | None = None
        self._router: Router | None = None
        self.changelog: dict[tuple[int, int], str] = {}  # (partition, offset) -> what
        self.changelog_failures = 0
        self.changelog_errors: list[str] = []
        self._changelog_producer: Producer | None = None
        self._producer_lock = threading.Lock()

    @property
    def config(self) -> Config:
        """The router's configuration, once :meth:`start`ed."""
        if self._config is None:
            raise RuntimeError("the stage is not started")
        return self._config

    @property
    def router(self) -> Router:
        """The router process, once :meth:`start`ed."""
        if self._router is None:
            raise RuntimeError("the stage is not started")
        return self._router

    def __enter__(self) -> Stage:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            if self._router is not None:
                self._router.close()
        finally:
            if self.kafka is not None:
                self.kafka.stop()

    # --- set up ------------------------------------------------------------------------
    def start(self, max_offsets: int) -> None:
        t = time.monotonic()
        topics = {}
        if self.kafka is not None:
            bootstrap = self.kafka.start()
            self.log(f"Kafka: {self.kafka.size} broker(s) at {bootstrap} "
                     f"({time.monotonic() - t:.0f}s)")
        else:
            # A shared broker: topics of this run only.
            assert self.bootstrap is not None  # no Kafka of its own: a bootstrap was given
            bootstrap, tag = self.bootstrap, uuid.uuid4().hex[:10]
            topics = {"kafka.publishes_topic": f"pub-{tag}", "kafka.subscriptions_topic": f"subs-{tag}",
                      "kafka.rejected_topic": f"rej-{tag}",
                      "kafka.routing_view_topic": f"view-{tag}",
                      "kafka.routed_topic": f"routed-{tag}",
                      "kafka.deliveries_topic_prefix": f"dlv-{tag}."}
        self.settings = {
            **topics,
            "kafka.bootstrap": bootstrap,
            "broker.embedded": "false",
            "exchanges.dialects.other": "amqp",
            "delta.warehouse": str(self.folder / "delta"),
            "streaming.checkpoint_dir": str(self.folder / "checkpoints"),
            "streaming.max_offsets_per_trigger": str(max_offsets),
            "spark.master": "local[2]",
            "spark.shuffle_partitions": "2",
            "spark.log_level": "ERROR",
            # Maintenance often and eagerly, so that the mid-compaction and mid-vacuum
            # kill points are reached within a case (the defaults: 60 s, 16 files, 1 hour).
            "audit.maintenance_interval": "5 seconds",
            "audit.compact_min_files": "4",
            "audit.file_retention": "10 seconds",
            **self.extra,
        }
        self._config = load(overrides=self.settings, environ={})
        ensure_router_topics(self._config)
        self._router = Router(self.settings, self.folder / "router")

    def write_changelog(self, records: Iterable[tuple[str, bytes | None, bytes | None]]) -> int:
        """Produce (what, key, value) changelog records; wait for every ack; return how many."""
        with self._producer_lock:
            if self._changelog_producer is None:
                self._changelog_producer = producer(self.config.kafka.client_settings)
            p = self._changelog_producer
        count = 0
        for what, key, value in records:
            def acked(err, msg, what=what) -> None:
                if err is None:
                    self.changelog[(msg.partition(), msg.offset())] = what
                else:
                    self.changelog_failures += 1
                    if len(self.changelog_errors) < 20:
                        self.changelog_errors.append(f"{what}: {err}")
            kafka.produce_when_room(p, self.config.kafka.subscriptions_topic, value, key,
                                    on_delivery=acked)
            count += 1
        if p.flush(300):
            raise CampaignError("the changelog was not acknowledged within 300s")
        if self.changelog_failures:
            raise CampaignError(f"{self.changelog_failures} changelog records refused by Kafka: "
                                f"{self.changelog_errors[:2]}")
        return count

    def start_router(self) -> float:
        seconds = self.router.start()
        self.log(f"router up in {seconds:.0f}s (start {self.router.starts})")
        return seconds

    # --- traffic -------------------------------------------------------------------------
    def publish_good(self, w: Workload, ledger: Ledger, n: int, rate: float, seed: int,
                     incarnation: int = 0, until: threading.Event | None = None) -> Publisher:
        """Start publishing ``n`` good publishes of ``w`` at ``rate``/s into ``ledger``
        (under the message ids of the publishes topic's ``incarnation``); fewer if ``until``
        is set first."""
        codes = np.fromiter((encode(p) for p in w.publishes(n, seed)), dtype=np.int32, count=n)
        failures: list[str] = []

        def records():
            for code in codes.tolist():
                if until is not None and until.is_set():
                    return
                p = decode(code)
                yield p.key().encode(), b"x" * 16, p.headers()

        def ack(index: int, mid: str) -> None:
            if incarnation:
                topic, partition, offset = mid.rsplit("/", 2)
                mid = message_id(topic, int(partition), int(offset), incarnation)
            ledger.add(mid, w.expected(decode(int(codes[index]))))

        return Publisher(self.config.kafka.client_settings, self.config.kafka.publishes_topic,
                         records(), rate, ack, lambda i, e: failures.append(e)).start()

    def publish_records(self, records: list[tuple[Record, tuple[str, ...] | None]], ledger: Ledger,
                        rate: float, categories: dict[str, str] | None = None,
                        labels: list[str] | None = None) -> Publisher:
        """Start publishing (record, expected) pairs (expected None = bad) into ``ledger``;
        ``categories[mid] = labels[i]`` on each ack when given."""
        def ack(index: int, mid: str) -> None:
            ledger.add(mid, records[index][1])
            if categories is not None and labels is not None:
                categories[mid] = labels[index]

        return Publisher(self.config.kafka.client_settings, self.config.kafka.publishes_topic,
                         (r for r, _ in records), rate, ack, lambda i, e: None,
                         **{"message.max.bytes": 1_000_000}).start()

    def wait_routed(self, timeout: float, alive: Callable[[], bool] | None = None) -> float:
        """Wait until the router committed every publish in Kafka now (in realtime mode,
        and its audit query every routed record: the audit trails the routing by a
        checkpoint interval); return the seconds it took."""
        k, checkpoint = self.config.kafka, Path(self.settings["streaming.checkpoint_dir"])
        alive = alive or self.router.alive
        t = time.monotonic()
        wait_routed(k.client_settings, k.publishes_topic, checkpoint, timeout, alive, self.mode)
        if self.mode == REALTIME:
            wait_audited(k.client_settings, k.routed_topic, checkpoint,
                         max(1.0, timeout - (time.monotonic() - t)), alive)
        return time.monotonic() - t

    def lag(self) -> int:
        """Publishes in Kafka the router has not committed yet."""
        return lag(self.config.kafka.client_settings, self.config.kafka.publishes_topic,
                   Path(self.settings["streaming.checkpoint_dir"]), self.mode)

    # --- outputs -------------------------------------------------------------------------
    def read_outputs(self, ledger: Ledger) -> tuple[Rejections, dict]:
        """Every delivery topic, the rejected topic and the audit tables into ``ledger``;
        return the rejections and the ``subscriptions`` rows by changelog position."""
        ledger.seal()
        t = time.monotonic()
        read = read_deliveries(self.config, ledger)
        rejected = read_rejected(self.config, ledger)
        read_audit(self.config, ledger)
        rows = subscription_rows(self.config)
        self.log(f"outputs read: {read:,} delivery records, {len(rejected.publishes):,} + "
                 f"{len(rejected.subscriptions):,} rejected, audit tables "
                 f"({time.monotonic() - t:.0f}s)")
        return rejected, rows

    def changelog_checks(self, rows: dict) -> dict:
        """Every acknowledged changelog record has exactly one ``subscriptions`` row."""
        missing = sum(1 for position in self.changelog if position not in rows)
        return {"changelog_records": len(self.changelog), "changelog_without_row": missing,
                "changelog_repeated_rows": repeated_subscription_rows(rows)}

    def replication(self) -> dict:
        """Replicas and ``min.insync.replicas`` of the router's topics."""
        admin = kafka.admin(self.config.kafka.client_settings)
        k = self.config.kafka
        topics = [t for t in admin.list_topics(timeout=30).topics.values()
                  if t.topic in (k.publishes_topic, k.subscriptions_topic, k.rejected_topic)
                  or t.topic.startswith(k.deliveries_topic_prefix)]
        replicas = {t.topic: min(len(p.replicas) for p in t.partitions.values()) for t in topics}
        resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in replicas]
        isr = {}
        for resource, future in admin.describe_configs(resources).items():
            entry = future.result(timeout=60).get("min.insync.replicas")
            isr[resource.name] = int(entry.value) if entry is not None else None
        return {"topics": len(replicas),
                "min_replicas": min(replicas.values(), default=0),
                "min_insync": min((v for v in isr.values() if v is not None), default=0),
                "topics_not_rf": sorted(t for t, r in replicas.items()
                                        if r != self.config.kafka.replication_factor)[:5]}


class Churn:
    """Subscription changes every ``interval`` seconds that change no expected delivery:
    re-upserts of live subscriptions with their own value, and upserts and removals
    of subscriptions on ``z.churn.<n>`` (a filter no publish matches). Each makes the
    router's next catch-up commit a new snapshot version."""

    def __init__(self, stage: Stage, w: Workload, interval: float, seed: int) -> None:
        self.stage, self.w, self.interval = stage, w, interval
        self.rng = random.Random(seed)
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="churn")

    def start(self) -> Churn:
        self._thread.start()
        return self

    def _run(self) -> None:
        live: list[str] = []
        while not self._stop.wait(self.interval):
            records: list[tuple[str, bytes, bytes | None]] = []
            sid, exchange, subscriber, filt, gold = self.rng.choice(self.w.subscriptions)
            from tests.reliability.workload import changelog_value
            records.append(("churn re-upsert", sid.encode(),
                            changelog_value(exchange, subscriber, filt, gold)))
            if live and self.rng.random() < 0.4:
                records.append(("churn remove", live.pop(self.rng.randrange(len(live))).encode(),
                                None))
            else:
                name = f"churn-{self.count}"
                live.append(name)
                records.append(("churn add", name.encode(), changelog_value(
                    "amq.topic", self.w.subscribers[0], f"z.churn.{self.count}")))
            self.stage.write_changelog(records)
            self.count += len(records)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
