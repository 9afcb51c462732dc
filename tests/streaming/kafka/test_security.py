"""bitroute on a secured Kafka: SASL_SSL and SASL_PLAINTEXT (PLAIN, SCRAM-SHA-256/512),
TLS with a CA file only, mTLS, ACLs.

One broker for the module (tests/secured_broker.py), started once and stopped
always. Each principal's ``[kafka.client]`` is a config file whose password
is ``env:...``; the CLI verbs run as real processes, so their exit status and
every line they print are checked, and no output may contain a password.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from secured_broker import PLAIN_USERS, SCRAM_USERS, SecuredBroker, make_ca
from streaming import kafka
from streaming.config import load
from streaming.kafka.broker import free_port
from waiting import wait_until

REPO = Path(__file__).resolve().parents[3]
FAIL_WITHIN_S = 15.0
"""A refused client reports it within this (librdkafka's first attempt plus a process start)."""
PASSWORDS = [pw for _, pw in SCRAM_USERS.values()] + list(PLAIN_USERS.values())


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):
    secured = SecuredBroker(tmp_path_factory.mktemp("secured-kafka"))
    try:
        secured.start()
        yield secured
    finally:
        secured.stop()


@pytest.fixture
def names() -> dict[str, str]:
    tag = uuid.uuid4().hex[:8]
    return {"kafka.publishes_topic": f"pubs-{tag}", "kafka.subscriptions_topic": f"subs-{tag}",
            "kafka.rejected_topic": f"rej-{tag}", "kafka.retained_topic": f"ret-{tag}",
            "kafka.deliveries_topic_prefix": f"dlv-{tag}."}


def _config_file(folder: Path, bootstrap: str, names: dict[str, str],
                 client: dict[str, str]) -> tuple[Path, dict[str, str]]:
    """A config file with ``client`` as [kafka.client], its password read from the environment."""
    env = {}
    lines = ["[kafka]", f'bootstrap = "{bootstrap}"']
    lines += [f'{key.split(".", 1)[1]} = "{value}"' for key, value in names.items()]
    lines.append("[kafka.client]")
    for key, value in client.items():
        if key.endswith("password"):
            env["BITROUTE_TEST_KAFKA_PASSWORD"] = value
            value = "env:BITROUTE_TEST_KAFKA_PASSWORD"
        lines.append(f'"{key}" = "{value}"')
    path = folder / f"bitroute-{uuid.uuid4().hex[:6]}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path, env


def _cli(config: Path, env: dict[str, str], *args: str, timeout: float = 120
         ) -> tuple[int, str, str, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "streaming.cli.main", *args, "--config", str(config)],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env, "PYTHONPATH": str(REPO)})
    _no_secret(done.stdout + done.stderr)
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def _no_secret(text: str) -> None:
    for password in PASSWORDS:
        assert password not in text, f"a password was printed: {text[:2000]}"


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def _as(broker: SecuredBroker, tmp_path: Path, names: dict[str, str], user: str):
    return _config_file(tmp_path, broker.sasl_bootstrap, names, broker.sasl_properties(user))


def _tail_as(broker: SecuredBroker, config, user: str, subscriber: str, records: int
             ) -> list[bytes]:
    """The payloads of ``subscriber``'s first ``records`` deliveries, read by ``bitroute
    tail``'s code as SASL ``user`` with ``config``'s other settings."""
    from streaming.kafka import client_verbs as client

    reader = dataclasses.replace(config, kafka=dataclasses.replace(
        config.kafka, client=broker.sasl_properties(user)))
    return [d.payload for d in client.tail(reader, subscriber, from_beginning=True,
                                           max_records=records, timeout_s=60)]


def _deliver(broker: SecuredBroker, topic: str, payload: bytes) -> None:
    producer = kafka.producer(broker.settings("admin"))
    producer.produce(topic, payload, b"a.b")
    assert producer.flush_within(30) == 0


def _subscribe_as_admin(broker, tmp_path, names, subscriber: str) -> None:
    config, env = _as(broker, tmp_path, names, "admin")
    status, out, err, _ = _cli(config, env, "subscribe", "--exchange", "amq.topic",
                               "--subscriber", subscriber, "--filter", "a.#")
    assert status == 0, err


def _grant_router_acls(broker: SecuredBroker, names: dict[str, str],
                       publishes: tuple[str, ...] = ("Read", "Describe", "Create"),
                       deliveries: tuple[str, ...] = ("Write", "Describe", "Create")) -> None:
    """The router principal's ACLs as docs/security.md lists them (``publishes`` and
    ``deliveries``: its operations on the publishes and delivery topics, to withhold one)."""
    router = "User:router"
    broker.grant(router, "topic", names["kafka.publishes_topic"], list(publishes))
    broker.grant(router, "topic", names["kafka.subscriptions_topic"], ["Read", "Describe", "Create"])
    broker.grant(router, "topic", names["kafka.rejected_topic"], ["Write", "Describe", "Create"])
    broker.grant(router, "topic", names["kafka.retained_topic"],
                 ["Read", "Write", "Describe", "Create"])
    broker.grant(router, "topic", names["kafka.deliveries_topic_prefix"],
                 list(deliveries), prefixed=True)


def test_a_subscriber_reads_its_own_topic_and_is_refused_another(broker, tmp_path, names):
    prefix = names["kafka.deliveries_topic_prefix"]
    for subscriber in ("alice", "bob"):
        _subscribe_as_admin(broker, tmp_path, names, subscriber)
        _deliver(broker, prefix + subscriber, f"for {subscriber}".encode())
    broker.grant("User:alice", "topic", prefix + "alice", ["Read"])

    config, env = _as(broker, tmp_path, names, "alice")
    status, out, err, _ = _cli(config, env, "tail", "alice", "--from-beginning", "--max", "1",
                               "--timeout", "60")
    assert status == 0, err
    assert out.strip().endswith('"for alice"') or out.strip().endswith("for alice"), out

    status, out, err, took = _cli(config, env, "tail", "bob", "--from-beginning", "--max", "1",
                                  "--timeout", "60")
    line = _one_line(err)
    assert status == 1 and out == ""
    assert took < FAIL_WITHIN_S
    assert line.startswith("bitroute: error: ")
    assert "User:alice" in line and f"{prefix}bob" in line and "--operation Read" in line, line


def test_scram_256_plain_and_mtls_principals_connect(broker, tmp_path, names):
    prefix = names["kafka.deliveries_topic_prefix"]
    _subscribe_as_admin(broker, tmp_path, names, "carol")
    _deliver(broker, prefix + "carol", b"for carol")
    broker.grant("User:CN=carol", "topic", prefix + "carol", ["Read"])
    config, env = _config_file(tmp_path, broker.mtls_bootstrap, names, broker.mtls_properties())
    status, out, err, _ = _cli(config, env, "tail", "carol", "--from-beginning", "--max", "1",
                               "--timeout", "60")
    assert status == 0, err
    assert "for carol" in out

    # PLAIN: a publisher allowed to write the publishes topic only.
    publishes = names["kafka.publishes_topic"]
    # The admin's first publish creates the topic.
    assert _cli(*_as(broker, tmp_path, names, "admin"), "publish", "--routing-key", "a.b",
                "first")[0] == 0
    broker.grant("User:pat", "topic", publishes, ["Write"])
    status, out, err, _ = _cli(*_as(broker, tmp_path, names, "pat"), "publish", "--routing-key",
                               "a.b", "hello")
    assert status == 0, err
    assert out.strip().startswith(f"{publishes}/")


def test_a_client_without_credentials_fails_in_seconds_with_one_line(broker, tmp_path, names):
    _subscribe_as_admin(broker, tmp_path, names, "dave")
    # Plaintext against the SASL_SSL listener.
    config, env = _config_file(tmp_path, broker.sasl_bootstrap, names, {})
    status, out, err, took = _cli(config, env, "tail", "dave", "--from-beginning", "--timeout", "60")
    assert status == 1 and out == "" and took < FAIL_WITHIN_S, (status, err, took)
    assert "security.protocol" in _one_line(err)

    # The right protocol, a wrong password.
    wrong = {**broker.sasl_properties("alice"), "sasl.password": "not-the-password"}
    config, env = _config_file(tmp_path, broker.sasl_bootstrap, names, wrong)
    status, out, err, took = _cli(config, env, "publish", "--routing-key", "a.b", "x")
    line = _one_line(err)
    assert status == 1 and took < FAIL_WITHIN_S, (status, err, took)
    assert "User:alice" in line and "authentication" in line.lower(), line
    assert "not-the-password" not in err


def test_the_router_routes_with_only_kafka_client_settings(broker, tmp_path, names, spark,
                                                           capfd, caplog):
    """The router principal holds exactly the ACLs docs/security.md lists."""
    for logger in ("streaming", "bitroute.kafka"):  # the library's logs and librdkafka's
        caplog.set_level(logging.INFO, logger=logger)
    from streaming.router.service import Router

    prefix = names["kafka.deliveries_topic_prefix"]
    _grant_router_acls(broker, names)
    _subscribe_as_admin(broker, tmp_path, names, "erin")
    broker.grant("User:alice", "topic", prefix + "erin", ["Read"])

    path, env = _as(broker, tmp_path, names, "router")
    config = load(path, overrides={"streaming.checkpoint_dir": str(tmp_path / "checkpoints"),
                                   "delta.warehouse": str(tmp_path / "delta")}, environ=env)
    running = Router(config, spark)
    running.start()
    try:
        admin_config, admin_env = _as(broker, tmp_path, names, "admin")
        status, out, err, _ = _cli(admin_config, admin_env, "publish", "--routing-key", "a.b",
                                   "routed securely")
        assert status == 0, err
        running.process_all_available()
    finally:
        running.stop()
    assert _tail_as(broker, config, "alice", "erin", 1) == [b"routed securely"]

    out, err = capfd.readouterr()
    _no_secret(out + err + caplog.text)
    for path in (tmp_path / "checkpoints").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert not any(p.encode() in data for p in PASSWORDS), path
    # Spark's plan descriptions of the Kafka source show its secret options redacted.
    options = config.kafka.client_settings.spark_options()
    assert "kafka.sasl.jaas.config" in options
    source = (spark.readStream.format("kafka").options(**options)
              .option("subscribe", names["kafka.publishes_topic"]).load())
    described = source._jdf.queryExecution().toString()
    _no_secret(described)
    pattern = spark.sparkContext._jvm.java.util.regex.Pattern.compile(
        spark.conf.get("spark.redaction.regex"))
    for key in ("kafka.sasl.jaas.config", "kafka.ssl.key.password", "kafka.ssl.keystore.key"):
        assert pattern.matcher(key).find(), key


def test_a_deleted_delivery_topic_the_router_may_not_create_rejects_only_its_deliveries(
        broker, tmp_path, names, spark):
    """The router may write the delivery topics but not create them: a subscriber's topic
    deleted by an administrator fails that subscriber's deliveries with a reason naming it
    and the grant; the same publish's other subscriber is delivered."""
    from deltalake import DeltaTable

    from schemas.records import OUTCOME_REJECTED
    from streaming.kafka.topics import create_topics
    from streaming.router.service import Router

    prefix = names["kafka.deliveries_topic_prefix"]
    _grant_router_acls(broker, names, deliveries=("Write", "Describe"))
    admin = kafka.admin(broker.settings("admin"))
    create_topics(admin, [prefix + "gus", prefix + "hal"], 1, 1, {})
    for subscriber in ("gus", "hal"):
        _subscribe_as_admin(broker, tmp_path, names, subscriber)
    path, env = _as(broker, tmp_path, names, "router")
    config = load(path, overrides={"streaming.checkpoint_dir": str(tmp_path / "checkpoints"),
                                   "delta.warehouse": str(tmp_path / "delta")}, environ=env)
    admin_config, admin_env = _as(broker, tmp_path, names, "admin")
    running = Router(config, spark)
    running.start()
    try:
        assert _cli(admin_config, admin_env, "publish", "--routing-key", "a.b", "one")[0] == 0
        running.process_all_available()
        admin.delete_topics([prefix + "gus"])[prefix + "gus"].result(30)
        wait_until(lambda: prefix + "gus" not in admin.list_topics(timeout=30).topics,
                   f"topic {prefix}gus deleted", timeout=30)
        assert _cli(admin_config, admin_env, "publish", "--routing-key", "a.b", "two")[0] == 0
        running.process_all_available()
        assert running.flush_audit(30)
    finally:
        running.stop()
    rows = sorted(DeltaTable(config.delta.table_path("messages")).to_pyarrow_table().to_pylist(),
                  key=lambda r: r["message_id"])
    assert [(r["outcome"], r["deliveries"]) for r in rows] == [("routed", 2), (OUTCOME_REJECTED, 1)]
    reason = rows[1]["reason"]
    assert f"the delivery topic {prefix}gus of subscriber gus does not exist" in reason, reason
    assert "--operation Create" in reason and "User:router" in reason, reason
    assert _tail_as(broker, config, "admin", "hal", 2) == [b"one", b"two"]


def test_a_publishes_topic_the_router_may_not_read_is_retried_naming_the_grant(
        broker, tmp_path, names, spark, caplog):
    """The Spark Kafka source (Kafka's Java client) refused the publishes: the batch is
    retried with one line naming the grant, and routes once the grant lands."""
    from streaming.router.service import Router

    publishes = names["kafka.publishes_topic"]
    router = "User:router"
    _grant_router_acls(broker, names, publishes=("Describe", "Create"))  # no Read yet
    _subscribe_as_admin(broker, tmp_path, names, "gail")
    path, env = _as(broker, tmp_path, names, "router")
    config = load(path, overrides={"streaming.checkpoint_dir": str(tmp_path / "checkpoints"),
                                   "delta.warehouse": str(tmp_path / "delta")}, environ=env)
    admin_config, admin_env = _as(broker, tmp_path, names, "admin")
    status, _, err, _ = _cli(admin_config, admin_env, "publish", "--routing-key", "a.b", "held")
    assert status == 0, err

    running = Router(config, spark)
    running.start()
    try:
        expected = (f"does not allow {router} to Read topic {publishes}: grant it with "
                    f"kafka-acls.sh --add --allow-principal {router} --operation Read "
                    f"--topic {publishes}")
        refusal = wait_until(lambda: next((m for m in caplog.messages if expected in m), None),
                             f"the retry line naming the grant ({expected})", timeout=120)
        assert refusal.startswith("batch ") and refusal.endswith("; retrying"), refusal
        assert "\n" not in refusal and "Exception" not in refusal, refusal
        assert running.query is not None and running.query.isActive, "the router gave up instead of retrying"

        broker.grant(router, "topic", publishes, ["Read"])
        running.process_all_available()
    finally:
        running.stop()
    assert _tail_as(broker, config, "admin", "gail", 1) == [b"held"]
    _no_secret(caplog.text)


def test_bitroute_run_keeps_trying_a_publishes_topic_kafka_stopped_serving_it(
        broker, tmp_path, names):
    """ACLs revoked under a running `bitroute run`: the Spark Kafka source's query fails
    in the driver; the process says what to grant in one line, keeps trying, and
    routes again once the grant is back."""
    publishes = names["kafka.publishes_topic"]
    router = "User:router"
    _grant_router_acls(broker, names)
    _subscribe_as_admin(broker, tmp_path, names, "hugo")
    config, env = _as(broker, tmp_path, names, "router")
    admin_config, admin_env = _as(broker, tmp_path, names, "admin")
    out, err = tmp_path / "run.out", tmp_path / "run.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "streaming.cli", "run", "--config", str(config),
             "--set", f"streaming.checkpoint_dir={tmp_path / 'checkpoints'}",
             "--set", f"delta.warehouse={tmp_path / 'delta'}",
             "--set", "broker.embedded=false", "--set", "streaming.trigger_interval=1 second"],
            stdout=stdout, stderr=stderr, env={**os.environ, **env, "PYTHONPATH": str(REPO)},
            start_new_session=True)

    def wait_for(path: Path, text: str, timeout: float = 180) -> str:
        def written() -> str | None:
            assert process.poll() is None, f"bitroute run exited: {err.read_text()[-3000:]}"
            content = path.read_text()
            return content if text in content else None
        return wait_until(written, f"{text!r} in {path.name}", timeout)

    try:
        wait_for(out, "Ctrl-C stops after the current batch")
        broker.revoke(router, "topic", publishes)
        expected = f"does not allow {router} to Read topic {publishes}: grant it with"
        refusal = next(line for line in wait_for(err, expected).splitlines() if expected in line)
        assert refusal.startswith("bitroute: reading the publishes failed"), refusal
        assert "Exception" not in refusal and "Traceback" not in err.read_text(), refusal

        broker.grant(router, "topic", publishes, ["Read"])
        status, _, published, _ = _cli(admin_config, admin_env, "publish", "--routing-key",
                                       "a.b", "after the grant")
        assert status == 0, published
        wait_for(out, "1 publishes, 1 deliveries")
        process.send_signal(signal.SIGINT)
        assert process.wait(120) == 0, err.read_text()[-3000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
    _no_secret(out.read_text() + err.read_text())


def test_a_refused_delivery_write_is_a_retried_failure_naming_what_to_grant(broker, tmp_path,
                                                                           names):
    """The workers' producer: a delivery topic the router may not write fails the batch
    (retried by the router) with the grant line, never rejects the publishes."""
    from streaming.router.batch.delivery import (
        DeliveryColumns,
        DeliveryProducer,
        DeliveryUnavailable,
        ProducerSettings,
    )

    prefix = names["kafka.deliveries_topic_prefix"]
    _subscribe_as_admin(broker, tmp_path, names, "fred")
    # Write on some topic, as a router has on its rejected topic: its idempotent producer
    # gets its producer id, and only the delivery topic is refused.
    broker.grant("User:alice", "topic", prefix + "alice-own", ["Write"])
    producer = DeliveryProducer(ProducerSettings(broker.settings("alice"), 1_048_576,
                                                 message_timeout_ms=10_000))
    started = time.monotonic()
    producer.produce_deliveries(DeliveryColumns.of_records([prefix + "fred"], [b"a.b"], [b"x"]))
    with pytest.raises(DeliveryUnavailable) as raised:
        producer.flush()
    assert time.monotonic() - started < FAIL_WITHIN_S
    message = str(raised.value)
    assert f"does not allow User:alice to Write topic {prefix}fred" in message, message
    assert "--operation Write" in message
    assert not producer.broken
    _no_secret(message)


def test_a_producer_refused_its_producer_id_names_the_grant_and_is_replaced(broker, tmp_path,
                                                                          names):
    """A principal with Write on no topic (bob: no test grants it one before this) is refused
    the idempotent producer id, which breaks librdkafka's producer for good: the batch fails
    with the cluster grant (never a raw KafkaException), and once the grant is given the
    routing process's next producer writes."""
    from streaming.router.batch.delivery import (
        DeliveryColumns,
        DeliveryUnavailable,
        ProducerSettings,
        cached_producer,
    )

    topic = names["kafka.deliveries_topic_prefix"] + "bob"
    _subscribe_as_admin(broker, tmp_path, names, "bob")
    settings = ProducerSettings(broker.settings("bob"), 1_048_576, message_timeout_ms=10_000)
    producer = cached_producer(settings)
    columns = DeliveryColumns.of_records([topic], [b"a.b"], [b"x"])
    lines: list[str] = []

    def refused_its_id() -> bool:  # each batch fails in one line until the id is refused
        producer.produce_deliveries(columns)
        with pytest.raises(DeliveryUnavailable) as raised:
            producer.flush()
        lines.append(str(raised.value))
        return producer.broken
    wait_until(refused_its_id, "the producer id refused (the producer marked broken)", 30,
               poll=1.0)
    assert ("does not allow User:bob to IdempotentWrite cluster kafka-cluster" in lines[-1]
            and "--operation IdempotentWrite --cluster" in lines[-1]), lines
    _no_secret("\n".join(lines))

    broker.grant("User:bob", "topic", topic, ["Write", "Describe"])
    replaced = cached_producer(settings)
    assert replaced is not producer and cached_producer(settings) is replaced

    def written() -> bool:
        replaced.produce_deliveries(columns)
        try:
            return replaced.flush() == []
        except DeliveryUnavailable:
            return False  # the ACL reaches every broker shortly after it is created
    wait_until(written, "a delivery written once bob may write", 30)


@pytest.mark.parametrize("user", ["router", "alice", "pat"])
def test_the_delivery_writer_writes_over_sasl_ssl(broker, names, user):
    """The kernel's delivery writer (librdkafka built into the kernel, TLS through the system
    OpenSSL) over SASL_SSL with SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN: the record arrives."""
    from streaming.router.batch.delivery import DeliveryColumns, DeliveryProducer, ProducerSettings

    topic = names["kafka.deliveries_topic_prefix"] + user
    admin = kafka.admin(broker.settings("admin"))
    from confluent_kafka.admin import NewTopic

    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    broker.grant(f"User:{user}", "topic", topic, ["Write", "Describe"])
    settings = kafka.ClientSettings.of(broker.sasl_bootstrap, broker.sasl_properties(user))
    producer = DeliveryProducer(ProducerSettings(settings, 1_048_576, message_timeout_ms=20_000))
    producer.produce_deliveries(DeliveryColumns.of_records([topic], [b"a.b"], [b"over tls"]))
    assert producer.flush() == []
    reader = kafka.consumer(broker.settings("admin"), "t")
    try:
        from confluent_kafka import TopicPartition

        reader.assign([TopicPartition(topic, 0, 0)])
        records = reader.consume(1, timeout=30)
    finally:
        reader.close()
    assert [(m.key(), m.value()) for m in records] == [(b"a.b", b"over tls")]
    assert dict(records[0].headers())["bitroute.snapshot_version"] == b"0"


def test_the_delivery_writer_refused_credentials_fail_fast_naming_the_principal(broker, names):
    """A wrong password: the delivery writer's flush raises the one-line access failure within
    seconds, not at message.timeout.ms, and no secret is in it."""
    from streaming.errors import KafkaAccessError
    from streaming.router.batch.delivery import DeliveryColumns, DeliveryProducer, ProducerSettings

    wrong = {**broker.sasl_properties("alice"), "sasl.password": "not-the-password"}
    settings = kafka.ClientSettings.of(broker.sasl_bootstrap, wrong)
    producer = DeliveryProducer(ProducerSettings(settings, 1_048_576, message_timeout_ms=120_000))
    started = time.monotonic()
    producer.produce_deliveries(DeliveryColumns.of_records(
        [names["kafka.deliveries_topic_prefix"] + "x"], [b"a.b"], [b"x"]))
    with pytest.raises(KafkaAccessError) as raised:
        producer.flush()
    assert time.monotonic() - started < FAIL_WITHIN_S
    message = str(raised.value)
    assert "User:alice" in message and "authentication" in message.lower(), message
    assert "not-the-password" not in message
    _no_secret(message)


@pytest.mark.parametrize("user, mechanism", [("pat", "PLAIN"), ("alice", "SCRAM-SHA-256"),
                                             ("bob", "SCRAM-SHA-512")])
def test_sasl_plaintext_publish_then_tail_with_each_mechanism(broker, tmp_path, names, user,
                                                              mechanism):
    """The user's own publish read back by its own tail, both over SASL_PLAINTEXT: the config
    names the user's delivery topic as its publishes topic, so one topic the user may Read
    and Write carries the round trip."""
    prefix = names["kafka.deliveries_topic_prefix"]
    subscriber = f"{user}-plain"
    _subscribe_as_admin(broker, tmp_path, names, subscriber)
    topic = prefix + subscriber
    broker.grant(f"User:{user}", "topic", topic, ["Read", "Write"])
    client = broker.sasl_properties(user, tls=False)
    assert client["sasl.mechanism"] == mechanism and client["security.protocol"] == "SASL_PLAINTEXT"
    config, env = _config_file(tmp_path, broker.sasl_plaintext_bootstrap,
                               {**names, "kafka.publishes_topic": topic}, client)

    payload = f"over SASL_PLAINTEXT as {mechanism}"
    status, out, err, _ = _cli(config, env, "publish", "--routing-key", "a.b", payload)
    assert status == 0, err
    assert out.strip().startswith(f"{topic}/"), out
    status, out, err, _ = _cli(config, env, "tail", subscriber, "--from-beginning", "--max", "1",
                               "--timeout", "60")
    assert status == 0, err
    assert out.strip().endswith(json.dumps(payload)), out


def test_tls_with_only_a_ca_file_is_the_anonymous_principal(broker, tmp_path, names):
    """Without a client certificate the TLS listener's principal is User:ANONYMOUS: it reads
    what ACLs grant User:ANONYMOUS and is refused the rest, the refusal naming it."""
    prefix = names["kafka.deliveries_topic_prefix"]
    for subscriber in ("gina", "hank"):
        _subscribe_as_admin(broker, tmp_path, names, subscriber)
        _deliver(broker, prefix + subscriber, f"for {subscriber}".encode())
    broker.grant("User:ANONYMOUS", "topic", prefix + "gina", ["Read"])
    config, env = _config_file(tmp_path, broker.tls_bootstrap, names, broker.tls_properties())

    status, out, err, _ = _cli(config, env, "tail", "gina", "--from-beginning", "--max", "1",
                               "--timeout", "60")
    assert status == 0, err
    assert out.strip().endswith('"for gina"'), out

    status, out, err, took = _cli(config, env, "tail", "hank", "--from-beginning", "--max", "1",
                                  "--timeout", "60")
    line = _one_line(err)
    assert status == 1 and out == "" and took < FAIL_WITHIN_S, (status, err, took)
    assert "User:ANONYMOUS" in line and f"{prefix}hank" in line and "--operation Read" in line


def test_a_broker_certificate_from_another_ca_fails_in_seconds_with_one_line(broker, tmp_path,
                                                                              names):
    other_ca = make_ca(tmp_path / "other", "other-ca")
    _subscribe_as_admin(broker, tmp_path, names, "ivan")
    for bootstrap, client in (
            (broker.tls_bootstrap, broker.tls_properties(other_ca)),
            (broker.sasl_bootstrap, {**broker.sasl_properties("alice"),
                                     "ssl.ca.location": str(other_ca)})):
        config, env = _config_file(tmp_path, bootstrap, names, client)
        status, out, err, took = _cli(config, env, "tail", "ivan", "--from-beginning",
                                      "--timeout", "60")
        line = _one_line(err)
        assert status == 1 and out == "" and took < FAIL_WITHIN_S, (status, err, took)
        assert line.startswith("bitroute: error: ") and "certificate" in line, line
        assert str(other_ca) in line, line


def test_a_realtime_router_delivers_and_audits_on_sasl_ssl_and_tells_no_secret(
        broker, tmp_path, names, spark):
    """Realtime mode on SASL_SSL: `bitroute run` with streaming.mode = "realtime", as the
    router principal with the ACLs docs/security.md lists (realtime mode's routing view and
    routed topics included), delivers a publish and audits it; no password in its output,
    its logs, the state folder or the tables, nor in the routing query's plan (the
    executors' Kafka properties travel inside the route function's object in the plan)."""
    from deltalake import DeltaTable

    from schemas.records import DELIVERIES, MESSAGES
    from streaming.realtime.query import UDF_NAME, register_route_function

    tag = names["kafka.publishes_topic"].split("-", 1)[1]
    names = {**names, "kafka.routing_view_topic": f"view-{tag}",
             "kafka.routed_topic": f"routed-{tag}"}
    router = "User:router"
    _grant_router_acls(broker, names)
    for topic in (names["kafka.routing_view_topic"], names["kafka.routed_topic"]):
        broker.grant(router, "topic", topic, ["Read", "Write", "Describe", "Create"])
    _subscribe_as_admin(broker, tmp_path, names, "ivy")
    broker.grant("User:alice", "topic", names["kafka.deliveries_topic_prefix"] + "ivy", ["Read"])
    config_path, env = _as(broker, tmp_path, names, "router")
    admin_config, admin_env = _as(broker, tmp_path, names, "admin")
    state, warehouse = tmp_path / "checkpoints", tmp_path / "delta"
    out, err = tmp_path / "run.out", tmp_path / "run.err"
    settings = {"streaming.mode": "realtime", "kafka.partitions": "1",
                "streaming.checkpoint_dir": str(state), "delta.warehouse": str(warehouse),
                "broker.embedded": "false", "spark.master": "local[2]",
                "audit.commit_interval": "1 second"}
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "streaming.cli", "run", "--config", str(config_path),
             *[a for k, v in settings.items() for a in ("--set", f"{k}={v}")]],
            stdout=stdout, stderr=stderr, env={**os.environ, **env, "PYTHONPATH": str(REPO)},
            start_new_session=True)

    def running() -> None:
        assert process.poll() is None, f"bitroute run exited: {err.read_text()[-3000:]}"

    def rows(table: str) -> list[dict] | None:
        running()
        try:
            found = DeltaTable(str(warehouse / table)).to_pyarrow_table().to_pylist()
        except Exception:  # noqa: BLE001 - not created yet
            return None
        return found or None

    try:
        def started() -> bool:
            running()
            return "Ctrl-C stops after the current batch" in out.read_text()

        wait_until(started, "the realtime router's start", 240)
        status, published, perr, _ = _cli(admin_config, admin_env, "publish", "--routing-key",
                                          "a.b", "routed in realtime")
        assert status == 0, perr
        alice_config, alice_env = _as(broker, tmp_path, names, "alice")
        reader = load(alice_config, environ=alice_env)
        from streaming.kafka import client_verbs as client

        got = list(client.tail(reader, "ivy", from_beginning=True, max_records=1, timeout_s=120))
        assert [d.payload for d in got] == [b"routed in realtime"]
        # A table read per poll every half second, not every 50 ms.
        [message] = wait_until(lambda: rows(MESSAGES), "the publish's messages row", 120, poll=0.5)
        [delivery] = wait_until(lambda: rows(DELIVERIES), "its deliveries row", 60, poll=0.5)
        assert message["outcome"] == "routed" and delivery["subscriber"] == "ivy"
        assert delivery["message_id"] == message["message_id"] == got[0].message_id
        process.send_signal(signal.SIGINT)
        assert process.wait(120) == 0, err.read_text()[-3000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
    assert "mode realtime" in out.read_text()
    _no_secret(out.read_text() + err.read_text())
    for folder in (state, warehouse):
        for path in folder.rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                assert not any(p.encode() in data for p in PASSWORDS), path
    # The routing query's plan, as Spark tells it (explain, the UI, its logs): the route
    # function's object carries the executors' SASL properties, its string form does not.
    config = load(config_path, overrides=settings, environ=env)
    options = config.kafka.client_settings.spark_options()
    register_route_function(spark, config, 0)
    routing = (spark.readStream.format("kafka").options(**options)
               .option("subscribe", names["kafka.publishes_topic"])
               .option("includeHeaders", "true").load()
               .selectExpr(f"inline({UDF_NAME}(partition, offset, key, value, headers, "
                           "timestamp))"))
    described = routing._jdf.queryExecution().toString()
    assert UDF_NAME in described, described[:2000]
    _no_secret(described)


# --- one policy at the edge: every Kafka verb fails in one line naming the cause ----------

EDGE_VERBS = {
    "subscribe": ["subscribe", "--exchange", "amq.topic", "--subscriber", "zed", "--filter", "a.#"],
    "unsubscribe": ["unsubscribe", "some-id"],
    "retire": ["retire", "zed"],
    "publish": ["publish", "--routing-key", "a.b", "x"],
    "tail": ["tail", "zed", "--timeout", "30"],
    "explain": ["explain", "--routing-key", "a.b"],
    "subscriptions": ["subscriptions"],
    "run": ["run", "--set", "broker.embedded=false"],
}


def _edge_cases(broker: SecuredBroker) -> dict[str, tuple[str, dict[str, str]]]:
    """Each failure's (bootstrap, [kafka.client]): no credentials (plaintext against the
    SASL_SSL listener), a wrong password, a principal without any ACL (alice), and a
    closed port."""
    return {
        "no credentials": (broker.sasl_bootstrap, {}),
        "wrong password": (broker.sasl_bootstrap, {**broker.sasl_properties("alice"),
                                                   "sasl.password": "not-the-password"}),
        "no ACL": (broker.sasl_bootstrap, broker.sasl_properties("alice")),
        "unreachable": (f"127.0.0.1:{free_port()}", broker.sasl_properties("alice")),
    }


def _edge_cause(case: str, bootstrap: str, line: str) -> bool:
    """Whether ``line`` names ``case``'s cause as docs/security.md says it does."""
    if case == "no credentials":  # not "cannot reach": the line says what was refused
        return "security.protocol" in line and "cannot reach" not in line
    if case == "wrong password":
        return "User:alice" in line and "authentication" in line.lower()
    if case == "no ACL":
        return ("does not allow User:alice to " in line
                and "kafka-acls.sh --add --allow-principal User:alice --operation" in line)
    return f"cannot reach Kafka at {bootstrap}" in line and "within" in line


@pytest.mark.parametrize("case", ["no credentials", "wrong password", "no ACL", "unreachable"])
def test_every_kafka_verb_fails_in_seconds_with_one_line_naming_the_cause(broker, tmp_path,
                                                                           names, case):
    """Each verb against the secured broker with one failure (the verbs as processes, run
    together, so the closed port's wait is paid once): exit status 1, one line on stderr
    naming the cause, nothing on stdout, no secret, within FAIL_WITHIN_S. publish has an
    incarnation record, so it looks the publishes topic's id up first (the admin lookup
    whose timeout once escaped)."""
    from streaming.router.topics.incarnations import IncarnationRecord

    bootstrap, client = _edge_cases(broker)[case]
    running = {}
    for verb, words in EDGE_VERBS.items():
        folder = tmp_path / verb
        folder.mkdir()
        config, env = _config_file(folder, bootstrap, names, client)
        state = ["--set", f"streaming.checkpoint_dir={folder / 'state'}",
                 "--set", f"delta.warehouse={folder / 'delta'}"]
        if verb == "publish":
            IncarnationRecord(load(config, overrides={"delta.warehouse": str(folder / "delta")},
                                   environ=env)).number_of("an-earlier-topic-id")
        process = subprocess.Popen(
            [sys.executable, "-m", "streaming.cli.main", *words, *state,
             "--config", str(config)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **env, "PYTHONPATH": str(REPO)}, start_new_session=True)
        running[verb] = (process, time.monotonic())
    results = {}
    try:
        for verb, (process, started) in running.items():
            out, err = process.communicate(timeout=120)
            results[verb] = (process.returncode, out, err, time.monotonic() - started)
    finally:
        for process, _ in running.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(30)
    for verb, (status, out, err, took) in results.items():
        _no_secret(out + err)
        assert "not-the-password" not in out + err, (verb, err)
        assert status == 1 and out == "", (verb, status, out, err)
        line = _one_line(err)
        assert line.startswith("bitroute: error: "), (verb, line)
        assert _edge_cause(case, bootstrap, line), (verb, line)
        assert took < FAIL_WITHIN_S, (verb, took, line)


def test_status_still_answers_naming_the_kafka_cause(broker, tmp_path, names):
    """`status` never fails for Kafka (it must answer while Kafka is down): with each
    failure it answers within its budget, no router running (status 3), its
    ``kafka_error`` naming the cause in the words of the other verbs' lines."""
    for case, (bootstrap, client) in _edge_cases(broker).items():
        folder = tmp_path / case.replace(" ", "-")
        folder.mkdir()
        config, env = _config_file(folder, bootstrap, names, client)
        status, out, err, took = _cli(config, env, "status", "--json", "--set",
                                      f"streaming.checkpoint_dir={folder / 'state'}", "--set",
                                      f"delta.warehouse={folder / 'delta'}")
        assert (status, err) == (3, ""), (case, status, err)
        cause = json.loads(out)["kafka_error"]
        assert _edge_cause(case, bootstrap, cause), (case, cause)
        assert took < FAIL_WITHIN_S, (case, took)
