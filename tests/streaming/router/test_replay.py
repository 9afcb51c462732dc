"""Replay (``subscribe --since``) on a real broker, real Spark and real Delta.

One router run (in this process, its query started) covers the boundary (every matching
publish once: replayed before the boundary, live from it on), a subscriber that already
had the publishes live (the replay adds nothing for it), two replays sharing their
reads, the bad changelog records (each rejected, nothing replayed), and a replay
cancelled by unsubscribing. A second test (``bitroute run`` and the command line) has the
command line refuse each bad ``--since`` at once, replays from the retention start a since
older than it (saying so on stderr and in ``bitroute status``), kills the router with
SIGKILL in the middle of the replay and checks that the restarted router finishes it with
one audit row per (message, subscriber).
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

from confluent_kafka import Producer
from deltalake import DeltaTable

from kafka_io import headers_of, read_topic
from schemas.records import (
    CHANGE_REJECTED,
    CHANGE_REMOVE,
    EXCHANGE_HEADER,
    MESSAGE_ID_HEADER,
    REPLAYED_HEADER,
    SUBSCRIPTION_IDS_HEADER,
)
from streaming.config import Config
from streaming.router.replay.replay import ReplayFeature, ReplayLedger, state_path
from streaming.router.service import Router
from streaming.state.checkpoint import CheckpointLayout
from waiting import wait_until


def _text(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _subscribe(producer: Producer, config: Config, sub_id: str, subscriber: str, filter_: str,
               since: str | None = None, exchange: str = "amq.topic") -> None:
    value = {"exchange": exchange, "subscriber": subscriber, "filter": filter_}
    if since is not None:
        value["since"] = since
    producer.produce(config.kafka.subscriptions_topic, json.dumps(value).encode(), sub_id.encode())
    assert producer.flush(30) == 0


def _publish(producer: Producer, config: Config, keys: list[str]) -> None:
    for key in keys:
        producer.produce(config.kafka.publishes_topic, b"x", key.encode(),
                         headers=[(EXCHANGE_HEADER, b"amq.topic")])
    assert producer.flush(30) == 0


def _deliveries(config: Config, subscriber: str) -> list[dict[str, str]]:
    return [headers_of(r) for r in read_topic(config, config.kafka.layout.topic(subscriber))]


def _audit(config: Config, table: str) -> list[dict]:
    return DeltaTable(config.delta.table_path(table)).to_pyarrow_table().to_pylist()


def _published(config: Config) -> dict[str, str]:
    """message id -> routing key of every publish (from the messages audit)."""
    return {r["message_id"]: r["routing_key"] for r in _audit(config, "messages")}


def _ledger(config: Config) -> ReplayLedger:
    return ReplayLedger.load(state_path(CheckpointLayout.of(config.streaming.checkpoint_dir)))


def _started(config: Config, spark) -> tuple[Producer, datetime, Router]:
    """A producer, a time just before ann's live subscription to ``o.#`` (a since every
    publish is after), and a router started after that subscription."""
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap, "linger.ms": 5})
    before = datetime.now(UTC) - timedelta(seconds=1)
    _subscribe(producer, config, "ann-live", "ann", "o.#")
    router = Router(config, spark)
    router.start()
    return producer, before, router


def test_a_replay_meets_the_live_stream_once_shares_reads_and_refuses_bad_records(
        isolated_config, spark):
    config = isolated_config(**{"kafka.partitions": "2", "streaming.max_offsets_per_trigger": "40",
                                "streaming.replay_chunk_publishes": "60",
                                "streaming.replay_share": "100"})
    producer, before, router = _started(config, spark)
    replays = router.feature(ReplayFeature).replays
    assert replays is not None
    try:
        _publish(producer, config, [f"{'op'[i % 2]}.{i}" for i in range(120)])
        router.process_all_available()
        replays.pause.set()  # the cancelled replay must not start before its removal
        since = _text(before)
        _subscribe(producer, config, "ann-again", "ann", "o.*", since)  # had them all live
        _subscribe(producer, config, "bob-o", "bob", "o.*", since)
        _subscribe(producer, config, "cy-p", "cy", "p.*", since)  # shares bob's reads
        _subscribe(producer, config, "dee-p", "dee", "p.*", since)  # cancelled below
        # Bad records: each rejected with its reason, none replayed.
        _subscribe(producer, config, "bad-future", "eve", "o.*",
                   _text(datetime.now(UTC) + timedelta(hours=1)))
        _subscribe(producer, config, "bad-text", "eve", "o.*", "yesterday")
        _subscribe(producer, config, "ann-live", "ann", "p.#", since)  # exists, other filter
        _publish(producer, config, [f"{'op'[i % 2]}.{i}" for i in range(120, 200)])
        router.process_all_available()
        producer.produce(config.kafka.subscriptions_topic, None, b"dee-p")
        assert producer.flush(30) == 0
        _publish(producer, config, ["o.200", "p.201"])
        router.process_all_available()
        ledger = _ledger(config)
        assert {r.request.subscription_id for r in ledger.replays} == {
            "ann-again", "bob-o", "cy-p"}
        assert all(r.boundary is not None for r in ledger.replays)
        replays.pause.clear()
        # Live publishes go on while the replays run.
        _publish(producer, config, [f"{'op'[i % 2]}.{i}" for i in range(202, 260)])
        router.process_all_available()
        wait_until(lambda: not _ledger(config).replays, "the replays to finish", 120)
        router.flush_audit(60)
    finally:
        router.stop()

    published = _published(config)
    o_ids = {m for m, key in published.items() if key.startswith("o.")}
    p_ids = {m for m, key in published.items() if key.startswith("p.")}
    assert len(o_ids) == 130 and len(p_ids) == 130
    audit = _audit(config, "deliveries")
    for subscriber, expected in (("bob", o_ids), ("cy", p_ids)):
        records = _deliveries(config, subscriber)
        counts = Counter(h[MESSAGE_ID_HEADER] for h in records)
        assert set(counts) == expected  # no gap
        assert max(counts.values()) == 1  # no duplicate
        replayed = {h[MESSAGE_ID_HEADER] for h in records if h.get(REPLAYED_HEADER) == "true"}
        assert 0 < len(replayed) < len(expected)  # a boundary in the middle of the traffic
        rows = [r for r in audit if r["subscriber"] == subscriber]
        assert Counter(r["message_id"] for r in rows) == counts  # one row each
        assert {r["message_id"] for r in rows if r["replayed"]} == replayed
        # The boundary: every replayed publish precedes every live one, per partition.
        for partition in ("0", "1"):
            last = max((int(m.rsplit("/", 1)[1]) for m in replayed
                        if m.rsplit("/", 2)[1] == partition), default=-1)
            first_live = min((int(m.rsplit("/", 1)[1]) for m in set(counts) - replayed
                              if m.rsplit("/", 2)[1] == partition), default=1 << 40)
            assert last < first_live
        assert all(json.loads(h[SUBSCRIPTION_IDS_HEADER]) == [f"{subscriber}-{'o' if subscriber == 'bob' else 'p'}"]
                   for h in records if h.get(REPLAYED_HEADER))
    # ann had every o.* live through ann-live: the replay of ann-again adds nothing.
    ann = Counter(h[MESSAGE_ID_HEADER] for h in _deliveries(config, "ann"))
    assert max(ann.values()) == 1 and not any(r["replayed"] for r in audit if r["subscriber"] == "ann")
    assert Counter(r["message_id"] for r in audit if r["subscriber"] == "ann") == ann
    # dee's replay was cancelled by the unsubscribe before it started (dee had the live
    # deliveries of its subscription's life only); eve got nothing.
    dee = [r for r in audit if r["subscriber"] == "dee"]
    assert dee and not any(r["replayed"] for r in dee)
    assert not any(h.get(REPLAYED_HEADER) for h in _deliveries(config, "dee"))
    assert not [r for r in audit if r["subscriber"] == "eve"]
    changes = {(r["subscription_id"], r["change"]): r["reason"] for r in _audit(config, "subscriptions")}
    assert "in the future" in changes["bad-future", CHANGE_REJECTED]
    assert "not an ISO-8601 time" in changes["bad-text", CHANGE_REJECTED]
    assert "exists with another definition" in changes["ann-live", CHANGE_REMOVE]
    rejected = {headers_of(r)["bitroute.message_id"]: r for r in read_topic(config, config.kafka.rejected_topic)}
    assert len(rejected) == 3


def test_a_replay_killed_midway_resumes_with_one_audit_row_per_delivery_and_the_cli_refuses_bad_input(
        isolated_settings, router_process, cli, tmp_path):
    from streaming.config import load

    settings = isolated_settings(**{"streaming.replay_chunk_publishes": "20",
                                    "streaming.replay_share": "100",
                                    "streaming.max_offsets_per_trigger": "1000"})
    config = load(overrides=settings, environ={})
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap, "linger.ms": 5})
    _subscribe(producer, config, "zed-live", "zed", "z.#")
    _publish(producer, config, [f"{'oz'[i % 2]}.{i}" for i in range(300)])
    first = router_process(settings)
    first.wait_for(__import__("re").compile(r"^batch \d+: .*"))
    wait_until(lambda: Path(config.delta.table_path("messages")).exists()
               and len(_published(config)) == 300, "the publishes routed", 120)
    # The command line refuses at once, writing nothing: a time in the future, no time at
    # all, an id that exists with another filter.
    for since, sub_id, problem in (("2999-01-01T00:00:00Z", "new", "in the future"),
                                   ("soon", "new", "expected an ISO-8601 time"),
                                   ("1h", "zed-live", "exists with another definition")):
        done = cli("subscribe", "--exchange", "amq.topic", "--subscriber", "zed", "--filter",
                   "o.*", "--id", sub_id, "--since", since, settings=settings)
        assert done.returncode != 0 and problem in done.stderr and not done.stdout
    # Kafka deleted the oldest publishes (retention): a since before them replays from the
    # retention start, and says so.
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap})
    topic = config.kafka.publishes_topic
    partitions = sorted(admin.list_topics(topic, timeout=30).topics[topic].partitions)
    for future in admin.delete_records([TopicPartition(topic, p, 10)
                                        for p in partitions]).values():
        future.result(30)
    done = cli("subscribe", "--exchange", "amq.topic", "--subscriber", "kim", "--filter", "o.*",
               "--id", "kim-o", "--since", "1h", settings=settings)
    assert done.returncode == 0 and done.stdout.strip() == "kim-o", done.stderr
    assert "before the retention start" in done.stderr

    def midway():
        replays = _ledger(config).replays
        return bool(replays) and replays[0].started_at is not None and 40 <= replays[0].done < 180
    wait_until(midway, "the replay to be under way", 120)
    status = json.loads(cli("status", "--json", settings=settings).stdout)
    (shown,) = status["replays"]
    assert shown["subscription"] == "kim-o" and shown["publishes"] == 300 - 10 * len(partitions) and shown["done"] >= 40
    assert "before the retention start" in shown["note"]
    first.kill()  # SIGKILL, its JVM too
    left = _ledger(config).replays[0]
    assert left.done < left.total
    second = router_process(settings)
    wait_until(lambda: not _ledger(config).replays, "the replay to finish after the restart", 180)
    second.terminate()
    o_ids = {m for m, key in _published(config).items() if key.startswith("o.")
             and int(m.rsplit("/", 1)[1]) >= 10}  # the retained ones
    assert len(o_ids) >= 100
    rows = [r for r in _audit(config, "deliveries") if r["subscriber"] == "kim"]
    assert Counter(r["message_id"] for r in rows) == Counter(o_ids)  # exactly once each
    assert all(r["replayed"] for r in rows)
    # Kafka has every one, at least once (a chunk cut by the kill is produced again).
    assert {h[MESSAGE_ID_HEADER] for h in _deliveries(config, "kim")} == o_ids


def test_a_replays_chunks_are_routed_by_the_executors_routing_task_and_audited_once(
        isolated_config, spark, monkeypatch, capsys):
    """The driver does no per-record work for a replay: its chunks are matched, narrowed to
    the replays' ranges and produced by the live batches' routing task in the Python
    workers, which write the chunk's audit file (here the driver's own copy of that work
    raises, and the replay still completes). Each replayed delivery is marked and audited
    once (the driver adds the tasks' files in one transaction per chunk), and `bitroute
    audit deliveries --replayed` lists exactly those."""
    from streaming.cli.main import main
    from streaming.router.replay.scope import ReplayScope

    def not_in_the_driver(*_args, **_kwargs):
        raise AssertionError("a replay's records were routed in the driver")

    monkeypatch.setattr(ReplayScope, "narrowed", not_in_the_driver)
    monkeypatch.setattr(ReplayScope, "matching_keys_only", not_in_the_driver)
    config = isolated_config(**{"kafka.partitions": "2", "streaming.replay_chunk_publishes": "50",
                                "streaming.replay_share": "100",
                                # As on a cluster: each task writes its audit file.
                                "streaming.executor_audit_files": "tasks"})
    producer, before, router = _started(config, spark)
    try:
        _publish(producer, config, [f"{'op'[i % 2]}.{i}" for i in range(160)])
        router.process_all_available()
        _subscribe(producer, config, "bob-o", "bob", "o.*", _text(before))
        _publish(producer, config, ["o.160", "p.161"])
        router.process_all_available()
        wait_until(lambda: not _ledger(config).replays and _ledger(config).finished,
                   "the replay to finish", 180)
        router.flush_audit(60)
    finally:
        router.stop()
    replays = router.feature(ReplayFeature).replays
    assert replays is not None and replays.failure is None
    o_ids = {m for m, key in _published(config).items() if key.startswith("o.")}
    records = _deliveries(config, "bob")
    assert Counter(h[MESSAGE_ID_HEADER] for h in records) == Counter(o_ids)  # once each
    replayed = {h[MESSAGE_ID_HEADER] for h in records if h.get(REPLAYED_HEADER) == "true"}
    assert len(replayed) == 80 and replayed < o_ids
    rows = [r for r in _audit(config, "deliveries") if r["subscriber"] == "bob"]
    assert Counter(r["message_id"] for r in rows) == Counter(o_ids)
    assert {r["message_id"] for r in rows if r["replayed"]} == replayed
    assert all(r["subscription_ids"] == ["bob-o"] for r in rows)
    assert _ledger(config).finished[-1]["delivered"] == 80
    capsys.readouterr()
    assert main(["audit", "deliveries", "--replayed", "--json", "--set",
                 f"delta.warehouse={config.delta.warehouse}"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {(r["message_id"], r["subscriber"]) for r in listed} == {(m, "bob") for m in replayed}
    assert all(r["replayed"] is True and r["retained"] is False for r in listed)
