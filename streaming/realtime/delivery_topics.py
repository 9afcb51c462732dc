"""Realtime mode and a deleted delivery topic: the router creates it again, as micro-batch mode does.

In micro-batch mode the routing process finds a delivery refused as an unknown topic
and creates the topic again as the layout says (:func:`streaming.router.batch.routing.deliver`).
In realtime mode the deliveries are written by Spark's Kafka sink (a Java producer),
which cannot be told to: a delivery to a topic the broker does not have fails the
routing task after the producer's ``max.block.ms`` (``Topic ... not present in
metadata``) or ``delivery.timeout.ms`` (``Expiring ... record(s) for <topic>-<p>``),
and with it the routing query. Before the supervisor starts the query again
(:mod:`streaming.realtime.supervisor`), :func:`recreate_missing_delivery_topics` reads
the failure for such a topic and, when it is a delivery topic of the layout and is
missing, creates it with the layout's settings and says so in micro-batch mode's line;
the restarted query routes again from its checkpoint and delivers.

A broker that creates topics on demand (``auto.create.topics.enable``, Kafka's
default) creates the topic itself at the producer's first request, with its own
defaults (``num.partitions``), before any failure: the router has nothing to do then
(the Java producer always asks for it; only the broker's setting prevents it).
"""

from __future__ import annotations

import logging
import re

from confluent_kafka import KafkaException

from streaming.config import Config
from streaming.errors import one_line
from streaming.kafka import KafkaAccessError
from streaming.kafka.topics import TopicCreationError, admin_client, recreate_delivery_topic

_log = logging.getLogger(__name__)

MISSING_TOPIC = (
    re.compile(r"Topic (\S+) not present in metadata"),
    re.compile(r"Expiring \d+ record\(s\) for (\S+)-\d+\s*:"),
)
"""The Java producer's failures that name a topic the broker does not have (the first
group): a send that found no metadata, a batch that expired waiting for a partition."""


def missing_topics_named(failure: str) -> list[str]:
    """The topics ``failure`` (a failed query's text) says the producer could not find."""
    return sorted({m.group(1) for pattern in MISSING_TOPIC for m in pattern.finditer(failure)})


def recreate_missing_delivery_topics(config: Config, failure: BaseException) -> list[str]:
    """Create again each delivery topic ``failure`` names as missing (module docstring);
    the topics created. Never raises: a topic that cannot be created is said in one line
    (the query's next start fails the same way, and this runs again)."""
    layout = config.kafka.layout
    named = [t for t in missing_topics_named(str(failure))
             if layout.subscriber_of(t) is not None or t == layout.shared_topic]
    if not named:
        return []
    created = []
    try:
        admin = admin_client(config)
    except Exception as exc:  # noqa: BLE001 - the next restart tries again
        _log.warning(f"could not create the delivery topics {', '.join(named)}: {one_line(exc)}")
        return []
    for topic in named:
        subscriber = layout.subscriber_of(topic)
        whose = f" of subscriber {subscriber}" if subscriber is not None else ""
        try:
            if recreate_delivery_topic(config.kafka.client_settings, layout, topic, admin):
                created.append(topic)
                _log.warning(f"the delivery topic {topic}{whose} did not exist (deleted while "
                             f"subscriptions feed it): created it again with {layout.partitions} "
                             "partitions")
        except (KafkaAccessError, TopicCreationError, KafkaException) as exc:
            _log.warning(f"the delivery topic {topic}{whose} does not exist and the router "
                         f"could not create it: {exc}")
    return created
