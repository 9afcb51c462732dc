"""The embedded broker: a real Kafka round trip, and the `bitroute broker` verbs."""

from __future__ import annotations

import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer

from streaming.kafka.broker import free_port
from waiting import wait_until


def test_produce_and_consume_a_record(kafka_bootstrap: str, new_topic):
    topic = new_topic()
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(topic, key=b"a.b", value=b"payload", headers=[("h", b"v")])
    assert producer.flush(30) == 0

    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": uuid.uuid4().hex,
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:
        def consumed():
            candidate = consumer.poll(1.0)
            return candidate if candidate is not None and candidate.error() is None else None

        message = wait_until(consumed, "a record consumed", timeout=30)
    finally:
        consumer.close()
    assert (message.key(), message.value(), message.headers()) == (b"a.b", b"payload", [("h", b"v")])


def test_broker_verbs_round_trip(tmp_path: Path, cli):
    flags = ["--set", f"broker.data_dir={tmp_path / 'broker'}",
             "--set", f"broker.port={free_port()}",
             "--set", f"broker.controller_port={free_port()}"]
    assert cli("broker", "status", *flags, cwd=tmp_path, timeout=180).stdout.strip() == "down"
    started = cli("broker", "start", *flags, cwd=tmp_path, timeout=180)
    try:
        assert started.returncode == 0, started.stderr
        bootstrap = started.stdout.strip()
        assert bootstrap.startswith("127.0.0.1:")
        again = cli("broker", "start", *flags, cwd=tmp_path, timeout=180)
        assert again.stdout.strip() == f"{bootstrap} (already running)"
        status = cli("broker", "status", *flags, cwd=tmp_path, timeout=180)
        assert status.returncode == 0 and status.stdout.startswith(f"up {bootstrap}")
    finally:
        stopped = cli("broker", "stop", *flags, cwd=tmp_path, timeout=180)
    assert stopped.stdout.strip() == "stopped"
    down = cli("broker", "status", *flags, cwd=tmp_path, timeout=180)
    assert (down.returncode, down.stdout.strip()) == (3, "down")
    assert cli("broker", "stop", *flags, cwd=tmp_path, timeout=180).stdout.strip() == "not running"
