"""The Kafka verbs on a real broker: subscribe, unsubscribe, publish, tail.

Each test gets its own topic names (through ``--set``), so tests share the
session's broker without seeing each other's records.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from schemas.records import (
    EXCHANGE_HEADER,
    MESSAGE_ID_HEADER,
    SNAPSHOT_VERSION_HEADER,
    SUBSCRIPTION_IDS_HEADER,
)
from streaming.cli.main import main
from waiting import wait_until

DEADLINE_S = 60.0


@pytest.fixture
def topics(isolated_settings) -> dict[str, str]:
    """Fresh names for this test's changelog, publishes topic and delivery topic prefix."""
    return isolated_settings()


def _flags(topics: dict[str, str]) -> list[str]:
    return [flag for key, value in topics.items() for flag in ("--set", f"{key}={value}")]


def _topic_names(bootstrap: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics)


def _records(bootstrap: str, topic: str) -> list:
    """Every record of ``topic`` up to its current end, in partition then offset order."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                         "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in partitions}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        records = []

        def all_read() -> bool:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                records.append(message)
            return len(records) >= sum(ends.values())

        if sum(ends.values()):
            wait_until(all_read, f"{sum(ends.values())} records read from {topic}", DEADLINE_S)
        return sorted(records, key=lambda m: (m.partition(), m.offset()))
    finally:
        consumer.close()


def _one_line_error(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert lines[0].startswith("bitroute: error: ")
    return lines[0]


# --- subscribe / unsubscribe -------------------------------------------------------

def test_subscribe_writes_the_changelog_record_and_creates_the_delivery_topic(topics, cli):
    result = cli("subscribe", "--exchange", "mqtt", "--subscriber", "alice",
                  "--filter", "sensors/+/temp", "--id", "sub-1", "--header", "site=lyon",
                  "--header", "urgent", "--match", "any", settings=topics)
    assert (result.returncode, result.stdout, result.stderr) == (0, "sub-1\n", "")

    bootstrap = topics["kafka.bootstrap"]
    [record] = _records(bootstrap, topics["kafka.subscriptions_topic"])
    assert record.key() == b"sub-1"
    assert json.loads(record.value()) == {
        "exchange": "mqtt", "subscriber": "alice", "filter": "sensors/+/temp",
        "headers": {"match": "any", "criteria": {"site": "lyon", "urgent": None}},
    }
    assert topics["kafka.deliveries_topic_prefix"] + "alice" in _topic_names(bootstrap)
    changelog = ConfigResource(ConfigResource.Type.TOPIC, topics["kafka.subscriptions_topic"])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    settings = admin.describe_configs([changelog])[changelog].result(timeout=30)
    assert settings["cleanup.policy"].value == "compact"


def test_subscribe_defaults_a_fresh_id_and_no_header_criteria(topics, capsys):
    assert main(["subscribe", "--exchange", "amq.topic", "--subscriber", "bob",
                 "--filter", "orders.#", *_flags(topics)]) == 0
    sub_id = capsys.readouterr().out.strip()
    assert re.fullmatch(r"[0-9a-f]{32}", sub_id), sub_id

    [record] = _records(topics["kafka.bootstrap"], topics["kafka.subscriptions_topic"])
    assert record.key() == sub_id.encode()
    assert json.loads(record.value()) == {"exchange": "amq.topic", "subscriber": "bob",
                                          "filter": "orders.#"}


def test_subscribe_with_header_criteria_only_uses_the_match_everything_filter(topics, capsys):
    assert main(["subscribe", "--exchange", "amq.topic", "--subscriber", "carol", "--id", "h1",
                 "--header", "color=red", *_flags(topics)]) == 0
    [record] = _records(topics["kafka.bootstrap"], topics["kafka.subscriptions_topic"])
    assert json.loads(record.value()) == {
        "exchange": "amq.topic", "subscriber": "carol", "filter": "#",
        "headers": {"match": "all", "criteria": {"color": "red"}},
    }


@pytest.mark.parametrize("args, message", [
    (["--exchange", "nope", "--subscriber", "a", "--filter", "x"],
     "unknown exchange 'nope': the configuration declares amq.topic, mqtt"),
    (["--exchange", "mqtt", "--subscriber", "a", "--filter", "a/#/b"],
     "'#' must be the last level"),
    (["--exchange", "mqtt", "--subscriber", "a b", "--filter", "a"],
     "subscriber name must be"),
    (["--exchange", "mqtt", "--subscriber", "a", "--filter", "a", "--header", "=x"],
     "header criterion name must be"),
    (["--exchange", "mqtt", "--subscriber", "a", "--filter", "a", "--header", "k",
      "--header", "k=v"],
     "header 'k' is given twice"),
    (["--exchange", "mqtt", "--subscriber", "a"],
     "--filter is required unless --header is given"),
])
def test_subscribe_rejects_what_the_router_would_reject(topics, capsys, args, message):
    assert main(["subscribe", *args, *_flags(topics)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in _one_line_error(captured.err)
    assert topics["kafka.subscriptions_topic"] not in _topic_names(topics["kafka.bootstrap"])


def test_unsubscribe_writes_a_tombstone(topics, capsys):
    assert main(["subscribe", "--exchange", "mqtt", "--subscriber", "dave", "--filter", "#",
                 "--id", "gone", *_flags(topics)]) == 0
    assert main(["unsubscribe", "gone", *_flags(topics)]) == 0
    assert capsys.readouterr().out == "gone\ngone\n"

    records = _records(topics["kafka.bootstrap"], topics["kafka.subscriptions_topic"])
    assert [(r.key(), r.value() is None) for r in records] == [(b"gone", False), (b"gone", True)]


# --- publish -----------------------------------------------------------------------

def test_publish_prints_the_coordinates_of_the_acknowledged_record(topics, cli):
    result = cli("publish", "--exchange", "mqtt", "--routing-key", "sensors/7/temp",
                  "--header", "site=lyon", "--header", "unit=°C", "21.5", settings=topics)
    assert result.returncode == 0, result.stderr
    topic, partition, offset = result.stdout.strip().rsplit("/", 2)
    assert topic == topics["kafka.publishes_topic"]

    records = _records(topics["kafka.bootstrap"], topic)
    [record] = [r for r in records if (r.partition(), r.offset()) == (int(partition), int(offset))]
    assert record.key() == b"sensors/7/temp"
    assert record.value() == b"21.5"
    assert record.headers() == [("site", b"lyon"), ("unit", "°C".encode()),
                                (EXCHANGE_HEADER, b"mqtt")]


def test_publish_sends_file_bytes_to_the_default_exchange_unvalidated(topics, capsys, tmp_path):
    payload = bytes(range(256))
    (tmp_path / "blob").write_bytes(payload)
    # '+' is not allowed in an MQTT topic name: the router, not the client, rejects it.
    assert main(["publish", "--routing-key", "a/+/b", "--file", str(tmp_path / "blob"),
                 *_flags(topics)]) == 0
    assert main(["publish", "--routing-key", "empty", *_flags(topics)]) == 0
    ids = capsys.readouterr().out.split()

    records = {f"{r.topic()}/{r.partition()}/{r.offset()}": r
               for r in _records(topics["kafka.bootstrap"], topics["kafka.publishes_topic"])}
    blob, empty = records[ids[0]], records[ids[1]]
    assert (blob.key(), blob.value(), blob.headers()) == (
        b"a/+/b", payload, [(EXCHANGE_HEADER, b"amq.topic")])
    assert (empty.key(), empty.value()) == (b"empty", b"")


@pytest.mark.parametrize("header, message", [
    ("novalue", "expected NAME=VALUE"),
    ("exchange=mqtt", "give the exchange with --exchange"),
    (f"{MESSAGE_ID_HEADER}=x", "is set by the router"),
])
def test_publish_rejects_malformed_headers(topics, capsys, header, message):
    assert main(["publish", "--routing-key", "k", "--header", header, *_flags(topics)]) == 2
    assert message in _one_line_error(capsys.readouterr().err)


def test_publish_retain_marks_an_mqtt_publish_and_refuses_another_dialect(topics, capsys):
    assert main(["publish", "--exchange", "mqtt", "--routing-key", "sensors/1", "--retain",
                 "20", *_flags(topics)]) == 0
    message_id = capsys.readouterr().out.strip()
    [record] = [r for r in _records(topics["kafka.bootstrap"], topics["kafka.publishes_topic"])
                if f"{r.topic()}/{r.partition()}/{r.offset()}" == message_id]
    assert record.headers() == [("retain", b"true"), (EXCHANGE_HEADER, b"mqtt")]
    assert main(["publish", "--exchange", "amq.topic", "--routing-key", "a.b", "--retain",
                 *_flags(topics)]) == 2
    assert _one_line_error(capsys.readouterr().err) == (
        "bitroute: error: --retain: exchange 'amq.topic' is an amqp exchange; retained "
        "messages are MQTT's (exchanges.dialects)")


# --- tail --------------------------------------------------------------------------

def _deliver(topics: dict[str, str], subscriber: str, records: list[tuple]) -> str:
    """Produce records in the delivery format to ``subscriber``'s delivery topic."""
    from streaming.config import load
    from streaming.kafka.topics import ensure_topics

    config = load(overrides=topics, environ={})
    topic = config.kafka.layout.topic(subscriber)
    ensure_topics(config, [topic])
    producer = Producer({"bootstrap.servers": topics["kafka.bootstrap"]})
    for message_id, key, payload, headers, sub_ids, version in records:
        producer.produce(topic, key=key, value=payload, partition=0, headers=[
            *headers,
            (MESSAGE_ID_HEADER, message_id.encode()),
            (SUBSCRIPTION_IDS_HEADER, json.dumps(sub_ids).encode()),
            (SNAPSHOT_VERSION_HEADER, str(version).encode()),
        ])
    assert producer.flush(30) == 0
    return topic


def test_tail_json_decodes_utf8_and_binary_payloads(topics, capsys):
    _deliver(topics, "erin", [
        ("pubs/0/4", b"a.b", "héllo".encode(), [("exchange", b"amq.topic"), ("k", b"v")],
         ["s1", "s2"], 3),
        ("pubs/1/9", b"a.c", b"\xff\x00\x01", [], ["s1"], 4),
        ("pubs/1/10", b"a.d", b"never read", [], ["s1"], 4),
    ])
    assert main(["tail", "erin", "--from-beginning", "--max", "2", "--json",
                 "--timeout", str(DEADLINE_S), *_flags(topics)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line) for line in lines] == [
        {"message_id": "pubs/0/4", "routing_key": "a.b",
         "headers": {"exchange": "amq.topic", "k": "v"}, "subscription_ids": ["s1", "s2"],
         "snapshot_version": 3, "payload": "héllo", "payload_encoding": "utf-8"},
        {"message_id": "pubs/1/9", "routing_key": "a.c", "headers": {},
         "subscription_ids": ["s1"], "snapshot_version": 4,
         "payload": base64.b64encode(b"\xff\x00\x01").decode(), "payload_encoding": "base64"},
    ]


def test_tail_marks_a_retained_delivery(topics, capsys):
    _deliver(topics, "gina", [("pubs/0/1", b"s/1", b"20", [("retain", b"true"),
                                                            ("bitroute.retained", b"true")],
                               ["s1"], 2)])
    assert main(["tail", "gina", "--from-beginning", "--max", "1", "--json",
                 "--timeout", str(DEADLINE_S), *_flags(topics)]) == 0
    line = json.loads(capsys.readouterr().out)
    assert (line["retained"], line["headers"]) == (True, {"retain": "true"})
    assert main(["tail", "gina", "--from-beginning", "--max", "1",
                 "--timeout", str(DEADLINE_S), *_flags(topics)]) == 0
    assert capsys.readouterr().out.split() == ["pubs/0/1", "s/1", "subs=s1", "v2", "retained",
                                               "retain=true", "20"]


def test_tail_stops_when_idle_for_the_timeout(topics, capsys):
    _deliver(topics, "frank", [(f"pubs/0/{i}", b"x.y", b"hi there", [("n", str(i).encode())],
                                ["s"], 1) for i in range(3)])
    started = time.monotonic()
    assert main(["tail", "frank", "--from-beginning", "--timeout", "3", *_flags(topics)]) == 0
    assert time.monotonic() - started < DEADLINE_S
    assert capsys.readouterr().out.splitlines() == [
        f'pubs/0/{i} x.y subs=s v1 n={i} "hi there"' for i in range(3)]


def test_tail_starts_from_now_by_default(topics):
    _deliver(topics, "gina", [("pubs/0/1", b"old", b"old", [], ["s"], 1)])
    process = subprocess.Popen(
        [sys.executable, "-m", "streaming.cli.main", "tail", "gina", "--max", "1", "--json",
         "--timeout", str(DEADLINE_S), *_flags(topics)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The consumer's assignment is made when it announces itself on stderr.
        assert process.stderr is not None  # a PIPE
        lines = iter(process.stderr.readline, "")
        assert any("bitroute: tailing" in line for line in lines)
        _deliver(topics, "gina", [("pubs/0/2", b"new", b"new", [], ["s"], 2)])
        out, err = process.communicate(timeout=DEADLINE_S)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert [json.loads(line)["message_id"] for line in out.splitlines()] == ["pubs/0/2"]


def test_tail_right_after_subscribe_reads_the_delivery_within_seconds(topics):
    """Issue 19: a tail started right after ``subscribe`` created the topic waited minutes
    for librdkafka's next metadata refresh before it read a delivery made after it started."""
    assert main(["subscribe", "--exchange", "amq.topic", "--subscriber", "hana", "--filter", "a.#",
                 *_flags(topics)]) == 0
    process = subprocess.Popen(
        [sys.executable, "-m", "streaming.cli.main", "tail", "hana", "--from-beginning", "--max", "1",
         "--json", "--timeout", str(DEADLINE_S), *_flags(topics)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None  # a PIPE
        lines = iter(process.stderr.readline, "")
        assert any("bitroute: tailing" in line for line in lines)
        _deliver(topics, "hana", [("pubs/0/0", b"a.b", b"routed", [], ["s"], 1)])
        delivered = time.monotonic()
        out, err = process.communicate(timeout=DEADLINE_S)
        read_within = time.monotonic() - delivered
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert [json.loads(line)["payload"] for line in out.splitlines()] == ["routed"]
    assert read_within < 10.0


def test_tail_of_a_subscriber_without_a_topic_is_one_line_error(topics, capsys):
    assert main(["tail", "nobody", "--timeout", "1", *_flags(topics)]) == 1
    assert "no delivery topic" in _one_line_error(capsys.readouterr().err)


@pytest.mark.parametrize("verb", ["subscribe", "unsubscribe", "publish", "tail", "audit"])
def test_every_client_verb_has_help_with_the_shared_flags(capsys, verb):
    with pytest.raises(SystemExit) as exit_:
        main([verb, "--help"])
    assert exit_.value.code == 0
    usage = capsys.readouterr().out
    assert usage.startswith(f"usage: bitroute {verb}")
    assert "--config FILE" in usage and "--set SECTION.KEY=VALUE" in usage
