"""The kernel's delivery writer through a routing task, against the real broker: every
record byte for byte as the delivery contract says (topics, keys, values, headers in
order, both layouts), a record Kafka refuses rejecting its publish alone with Kafka's
reason, and Kafka unreachable failing the task."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Consumer, TopicPartition

from arrow_batches import source_batch
from compiler import Matcher, RoutingIndex, Snapshot, Subscription
from schemas.records import (
    MESSAGE_ID_HEADER,
    OUTCOME_REJECTED,
    OUTCOME_ROUTED,
    REPLAYED_HEADER,
    ROUTING_KEY_HEADER,
    SNAPSHOT_VERSION_HEADER,
    SUBSCRIPTION_IDS_HEADER,
)
from streaming.kafka.layout import DeliveryLayout
from streaming.kafka.partitioner import default_partition
from streaming.router.batch.delivery import DeliveryProducer, DeliveryUnavailable, ProducerSettings
from streaming.router.batch.routing import RouteSettings, route_batch
from streaming.router.replay.scope import ReplayScope

SUBSCRIPTIONS = [(b"s1", "ann", "a.*"), (b"s2", "ann", "a.#"), (b"s3", "bob", "a.b"),
                 (b"s\"4", "bob", "#")]
"""ann matches a.* twice over (two ids in one delivery), bob everything; one id needs
escaping in the subscription ids' JSON."""

PUBLISHES: list[tuple[bytes, bytes | None, list[tuple[str, bytes | None]]]] = [
    (b"a.b", b"payload", [("h1", b"v1"), (MESSAGE_ID_HEADER, b"forged"), ("h1", b"again"),
                          ("nul", None), ("\u00e9t\u00e9", b"\xff\x00")]),
    (b"a.c", b"", []),
    (b"z", None, [("only", b"x")]),
    (b"a", b"\x00" * 300, [(ROUTING_KEY_HEADER, b"forged too")]),
]
"""Router headers (forged) that must be dropped, repeated and null-valued headers, a
non-ASCII header name with binary bytes, an empty and a null payload."""


def _snapshot() -> Snapshot:
    index = RoutingIndex({"amq.topic": "amqp"})
    for sid, subscriber, filt in SUBSCRIPTIONS:
        value = json.dumps({"exchange": "amq.topic", "subscriber": subscriber, "filter": filt})
        index.upsert(Subscription.from_changelog(sid, value.encode()))
    return index.snapshot(7, {})


def _create(bootstrap: str, topics: dict[str, dict[str, str]]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, 1, 1, config=c) for t, c in topics.items()]).values():
        future.result(30)


def _contract_settings(bootstrap: str, new_topic, shared: bool,
                       replay: ReplayScope | None = None) -> RouteSettings:
    """Fresh topics for the contract's deliveries to ann and bob: a topic each, or the
    shared topic of 4 partitions (keyed); the settings that route into them (a replay's
    when ``replay`` is given)."""
    prefix = f"{new_topic()}."
    layout = DeliveryLayout(prefix, new_topic(4) if shared else None, 4 if shared else 1)
    if not shared:
        _create(bootstrap, {prefix + "ann": {}, prefix + "bob": {}})
    return RouteSettings("amq.topic", layout, new_topic(), 7, False,
                         ProducerSettings(bootstrap, 1_048_576, keyed_partitions=shared),
                         replay=replay)


def _written(bootstrap: str, layout: DeliveryLayout) -> list:
    """Every record in the contract's delivery topics (ann's and bob's, or the shared one)."""
    shared = layout.shared_topic
    topics = [shared] if shared is not None else [layout.topic("ann"), layout.topic("bob")]
    return [m for t in topics for m in _read(bootstrap, t, layout.partitions)]


def _read(bootstrap: str, topic: str, partitions: int = 1) -> list:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "t", "enable.auto.commit": False})
    try:
        records = []
        for p in range(partitions):
            high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            if not high:
                continue
            consumer.assign([TopicPartition(topic, p, 0)])
            got: list = []
            while len(got) < high:
                got += [m for m in consumer.consume(high - len(got), timeout=10) if m.error() is None]
            records += got
        return records
    finally:
        consumer.close()


def _expected(layout: DeliveryLayout) -> list[tuple]:
    """Every delivery as the contract states it, built here without the router's code:
    (topic, key, value, headers), headers in order."""
    matches = {b"a.b": {"ann": ['"s1"', '"s2"'], "bob": ['"s\\"4"', '"s3"']},
               b"a.c": {"ann": ['"s1"', '"s2"'], "bob": ['"s\\"4"']},
               b"z": {"bob": ['"s\\"4"']},
               b"a": {"ann": ['"s2"'], "bob": ['"s\\"4"']}}
    out = []
    for row, (key, value, headers) in enumerate(PUBLISHES):
        kept = [(k, v) for k, v in headers if not k.startswith("bitroute.")]
        for subscriber, ids in matches[key].items():
            own = kept + ([(ROUTING_KEY_HEADER, key)] if layout.shared else [])
            out.append((layout.topic(subscriber), subscriber.encode() if layout.shared else key,
                        value, own + [(MESSAGE_ID_HEADER, f"p/0/{row}".encode()),
                                      (SUBSCRIPTION_IDS_HEADER, f"[{','.join(ids)}]".encode()),
                                      (SNAPSHOT_VERSION_HEADER, b"7")]))
    return out


@pytest.mark.parametrize("shared", [False, True], ids=["topic-per-subscriber", "shared"])
def test_every_delivery_is_written_byte_for_byte_as_the_contract_says(kafka_bootstrap, new_topic,
                                                                      shared):
    settings = _contract_settings(kafka_bootstrap, new_topic, shared)
    rows = route_batch(Matcher(_snapshot()), DeliveryProducer(settings.producer),
                       source_batch(PUBLISHES), settings).to_pylist()

    assert [r["outcome"] for r in rows] == [OUTCOME_ROUTED] * 4
    layout = settings.layout
    written = _written(kafka_bootstrap, layout)
    got = [(m.topic(), m.key(), m.value(), m.headers()) for m in written]
    assert sorted(got, key=repr) == sorted(_expected(layout), key=repr)
    if shared:  # Kafka's default partitioner placed them: all of a subscriber's in its partition
        for m in written:
            assert m.partition() == default_partition(m.key(), layout.partitions)


def test_a_record_too_large_for_its_topic_rejects_its_publish_alone_with_kafkas_reason(
        kafka_bootstrap, new_topic):
    """A topic whose max.message.bytes is smaller than one publish's copy: that publish is
    rejected with Kafka's reason; the other publish to the same topic, which Kafka refused
    with it in one record batch, is written again on its own and routed."""
    prefix = f"{new_topic()}."
    _create(kafka_bootstrap, {prefix + "ann": {"max.message.bytes": "2000"}, prefix + "bob": {}})
    rejected = new_topic()
    settings = RouteSettings("amq.topic", DeliveryLayout(prefix), rejected, 7, False,
                             ProducerSettings(kafka_bootstrap, 1_048_576))
    batch = source_batch([(b"a.b", b"x" * 2100, []), (b"a.c", b"y" * 100, []),
                          (b"a.d", b"z" * 100, [])])
    rows = route_batch(Matcher(_snapshot()), DeliveryProducer(settings.producer), batch,
                       settings).to_pylist()

    assert rows[0]["outcome"] == OUTCOME_REJECTED
    assert rows[0]["reason"].startswith(f"Kafka refused the delivery to {prefix}ann: "
                                        "MSG_SIZE_TOO_LARGE"), rows[0]["reason"]
    assert [r["outcome"] for r in rows[1:]] == [OUTCOME_ROUTED] * 2
    assert [d["subscriber"] for d in rows[1]["deliveries"]] == ["ann", "bob"]
    assert {m.value() for m in _read(kafka_bootstrap, prefix + "ann")} == {b"y" * 100, b"z" * 100}
    assert [m.value() for m in _read(kafka_bootstrap, rejected)] == [b"x" * 2100]


def test_kafka_unreachable_raises_delivery_unavailable_and_rejects_nothing():
    settings = RouteSettings("amq.topic", DeliveryLayout("dlv."), "rejected", 7, False,
                             ProducerSettings("127.0.0.1:1", 1_048_576, message_timeout_ms=1500))
    with pytest.raises(DeliveryUnavailable, match="did not acknowledge 3 records"):
        route_batch(Matcher(_snapshot()), DeliveryProducer(settings.producer),
                    source_batch([(b"a.b", b"v", []), (b"z", b"v", [])]), settings)


def test_the_writer_takes_the_python_sides_properties_and_its_errors_hold_no_secret():
    """The writer's librdkafka properties are the connection's plus ProducerSettings', as
    strings (not a copy in Rust); a property librdkafka refuses is named, with every secret
    of the connection replaced in librdkafka's own text."""
    from bitroute_kernel import DeliveryWriter, KernelError

    from streaming.kafka.clients import native_config
    from streaming.kafka.settings import ClientSettings

    client = ClientSettings.of("127.0.0.1:1", {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "router", "sasl.password": "s3cret-pw"})
    config = dict(native_config(client, ProducerSettings(client, 1_048_576).librdkafka()))
    assert config["bootstrap.servers"] == "127.0.0.1:1" and config["sasl.password"] == "s3cret-pw"
    assert (config["enable.idempotence"], config["linger.ms"]) == ("true", "1000")
    with pytest.raises(KernelError) as raised:
        DeliveryWriter([*config.items(), ("compression.type", "s3cret-pw")], 1, client.secrets())
    message = str(raised.value)
    assert message.startswith("librdkafka refused the property compression.type"), message
    assert "s3cret-pw" not in message and "*****" in message, message


@pytest.mark.parametrize("replayed", [False, True], ids=["live", "replayed"])
@pytest.mark.parametrize("shared", [False, True], ids=["topic-per-subscriber", "shared"])
def test_the_python_sides_record_is_the_kernels_byte_for_byte(kafka_bootstrap, new_topic, shared,
                                                               replayed):
    """The delivery record's format lives in the kernel's writer (kernel/src/delivery.rs);
    DeliveryColumns.record rebuilds one delivery in Python for the rare record written
    again on its own (a record batch the broker refused whole). Both must write the same
    topic, key, value and headers, in the same order, for every delivery, a replay's
    (marked ``bitroute.replayed: true`` after the publish's headers) as a live one's."""
    import numpy as np
    import pyarrow as pa

    from streaming.router.batch.routing import delivery_columns, plan_batch

    ids = tuple(sid.decode() for sid, _, _ in SUBSCRIPTIONS)
    scope = ReplayScope(ids, np.zeros((len(ids), 1), np.int64), np.full((len(ids), 1), 1 << 40),
                        pa.array([], pa.string()), ("amq.topic",)) if replayed else None
    settings = _contract_settings(kafka_bootstrap, new_topic, shared, replay=scope)
    batch = source_batch(PUBLISHES)
    plan = plan_batch(Matcher(_snapshot()), batch, settings)
    if scope is not None:
        plan = scope.narrowed(plan, batch)
    columns = delivery_columns(plan, settings)
    producer = DeliveryProducer(settings.producer)
    producer.produce_deliveries(columns)
    assert producer.flush() == []

    written = [(m.topic(), m.key(), m.value(), m.headers() or [])
               for m in _written(kafka_bootstrap, settings.layout)]
    python_side = [columns.record(i) for i in range(len(columns))]
    assert len(python_side) == 7
    assert sorted(written, key=repr) == sorted(python_side, key=repr)
    for _, _, _, headers in python_side:
        names = [name for name, _ in headers]
        router = len(names) - 3 - (1 if shared else 0)  # the routing key, then the router's
        assert names[router:][-3:] == [MESSAGE_ID_HEADER, SUBSCRIPTION_IDS_HEADER,
                                       SNAPSHOT_VERSION_HEADER]
        assert (headers[router - 1] == (REPLAYED_HEADER, b"true")) == replayed
        assert names.count(REPLAYED_HEADER) == (1 if replayed else 0)
