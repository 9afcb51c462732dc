"""Realtime mode's deleted delivery topics (streaming/realtime/delivery_topics.py): the topic
a failed routing query names as missing, read from the Java producer's failures, and
created again with the layout's settings on a real broker."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient

from kafka_io import KAFKA_TIMEOUT_S
from streaming.realtime.delivery_topics import missing_topics_named, recreate_missing_delivery_topics

NOT_IN_METADATA = ("org.apache.spark.SparkException: Job aborted due to stage failure: ... "
                   "org.apache.kafka.common.errors.TimeoutException: Topic "
                   "bitroute.deliveries.cat not present in metadata after 60000 ms.")
EXPIRED = ("org.apache.kafka.common.errors.TimeoutException: Expiring 3 record(s) for "
           "bitroute.deliveries.dog-1:120000 ms has passed since batch creation")


def test_the_producers_failures_name_the_missing_topic():
    assert missing_topics_named(NOT_IN_METADATA) == ["bitroute.deliveries.cat"]
    assert missing_topics_named(EXPIRED) == ["bitroute.deliveries.dog"]
    assert missing_topics_named("Timeout expired while fetching topic metadata") == []


def test_a_missing_delivery_topic_named_by_a_failure_is_created_with_the_layouts_settings(
        isolated_config):
    config = isolated_config(**{"kafka.delivery_partitions": "2"})
    topic = config.kafka.layout.topic("cat")
    publishes = config.kafka.publishes_topic  # not a delivery topic: left alone
    failure = RuntimeError(f"Topic {topic} not present in metadata after 60000 ms.; "
                           f"Topic {publishes} not present in metadata after 60000 ms.")
    assert recreate_missing_delivery_topics(config, failure) == [topic]
    topics = AdminClient({"bootstrap.servers": config.kafka.bootstrap}).list_topics(
        timeout=KAFKA_TIMEOUT_S).topics
    assert len(topics[topic].partitions) == 2 and publishes not in topics
    assert recreate_missing_delivery_topics(config, failure) == []  # there now: nothing to do
