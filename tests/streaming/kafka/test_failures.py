"""The one classifier of Kafka failures (streaming.kafka.clients.failure) and the edge that
applies it, no broker needed: each cause's line, and the edge's fast failure of a client
that never reached the cluster (the secured broker's tests run every verb against each
cause: tests/streaming/kafka/test_security.py)."""

from __future__ import annotations

import concurrent.futures
import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from streaming.kafka import clients
from streaming.kafka.errors import ClientError, KafkaAccessError, TopicCreationError
from streaming.kafka.settings import ClientSettings

SETTINGS = ClientSettings.of("kafka-1:9093", {
    "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
    "sasl.username": "alice", "sasl.password": "secret-pw"})


def _said(exc: BaseException, **where) -> tuple[type, str]:
    told = clients.failure(SETTINGS, exc, **where)
    assert "secret-pw" not in str(told) and "\n" not in str(told)
    return type(told), str(told)


def test_a_refused_operation_names_the_grant():
    kind, line = _said(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)),
                       operation="Describe", kind="topic", name="pubs")
    assert kind is KafkaAccessError
    assert line.startswith("Kafka at kafka-1:9093 does not allow User:alice to Describe topic pubs")
    assert "--operation Describe --topic pubs" in line


def test_refused_credentials_name_the_principal_and_the_settings():
    kind, line = _said(KafkaException(KafkaError(KafkaError._AUTHENTICATION,
                                                 "SASL authentication error: bad password")))
    assert kind is KafkaAccessError
    assert "did not accept User:alice (SASL_SSL, SCRAM-SHA-256 as alice)" in line


@pytest.mark.parametrize("exc", [
    concurrent.futures.TimeoutError(),
    KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed while waiting for response")),
    KafkaException(KafkaError(KafkaError._TRANSPORT, "Connect to ipv4#10.0.0.5:9093 failed: "
                                                     "Connection refused (after 0ms in state CONNECT)")),
])
def test_no_answer_names_the_bootstrap_servers_and_the_time_waited(exc):
    kind, line = _said(exc, waited_s=7)
    assert kind is ClientError
    assert line.startswith("cannot reach Kafka at kafka-1:9093 (SASL_SSL, SCRAM-SHA-256 as alice) "
                           "within 7s: ")
    assert "in state" not in line


def test_a_missing_topic_is_named():
    kind, line = _said(KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)),
                       kind="topic", name="pubs")
    assert (kind, line) == (ClientError, "the topic pubs does not exist on Kafka at kafka-1:9093")


def test_a_refused_creation_and_other_errors_keep_kafka_s_words():
    assert _said(TopicCreationError("cannot create topic 'x': policy")) == (
        ClientError, "cannot create topic 'x': policy")
    kind, line = _said(KafkaException(KafkaError(KafkaError.POLICY_VIOLATION, "too many partitions")))
    assert (kind, line) == (ClientError, "Kafka at kafka-1:9093 failed: too many partitions")


def test_the_edge_tells_what_escapes_it_and_fails_a_client_that_never_reached_kafka():
    with pytest.raises(ClientError, match="^cannot reach Kafka at kafka-1:9093 "):
        with clients.edge(SETTINGS):
            raise concurrent.futures.TimeoutError()
    refused = KafkaError(KafkaError._TRANSPORT, "Connect to ipv4#10.0.0.5:9093 failed: refused")
    with clients.edge(SETTINGS, unreachable_after_s=0.2):
        inside, reached = clients.ClientErrors(SETTINGS), clients.ClientErrors(SETTINGS)
    outside = clients.ClientErrors(SETTINGS)
    for errors in (inside, outside):
        errors(refused)
    # Not a poll: the bound is elapsed time itself, so the test lets 0.25 s pass.
    time.sleep(0.25)
    outside.check()  # the router's clients wait an outage out
    with pytest.raises(ClientError, match=r"within 0\.2s: Connect to ipv4#10\.0\.0\.5:9093 failed"):
        inside.check()
    reached.reached()  # had an answer: an outage from now on is waited out
    reached(refused)
    time.sleep(0.25)  # past the bound again: a client that reached Kafka does not fail
    reached.check()
