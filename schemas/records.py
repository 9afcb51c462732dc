"""The record contracts: every Kafka header, JSON field and Delta column, named once.

Kafka, publishes (input): key = routing key (UTF-8), value = payload (opaque,
never parsed), headers = message properties used by header criteria, plus the
optional :data:`EXCHANGE_HEADER` (default exchange from config), :data:`RETAIN_HEADER` and
:data:`EXPIRY_HEADER`. The message
id is ``<topic>/<partition>/<offset>``: unique and stable across re-runs and replays; for
the n-th recreation of the publishes topic (incarnation n >= 1, recorded by
:mod:`streaming.router.topics.incarnations`) it is ``<topic>~<n>/<partition>/<offset>``
(``~`` cannot occur in a Kafka topic name). It is built (:func:`message_id`,
:func:`message_id_column`) and parsed (:data:`MESSAGE_ID_PATTERN`) here and
nowhere else.

Kafka, subscriptions (compacted changelog): key = subscription id; value =
JSON ``{exchange, subscriber, filter, headers?: {match, criteria}, since?, retain_handling?,
retain_as_published?}``
(:data:`SUBSCRIPTION_FIELDS`, the names the parser ``compiler.subscription`` reads);
a null value (tombstone) removes it.

Kafka, deliveries: one topic per subscriber (the default layout); value = the
original payload, key = the routing key, headers = the original headers plus
:data:`MESSAGE_ID_HEADER`, :data:`SUBSCRIPTION_IDS_HEADER` (a JSON array of the
matched subscription ids) and :data:`SNAPSHOT_VERSION_HEADER` (decimal); a replayed delivery also carries
:data:`REPLAYED_HEADER`. In the
shared layout (``kafka.delivery_layout = "shared"``) every subscriber's
deliveries go to one shared topic keyed by subscriber: key = the subscriber
name, partition = Kafka's default (murmur2) partition of that key, and the
routing key moves to :data:`ROUTING_KEY_HEADER`; value and the other headers
are as above. :class:`streaming.kafka.layout.DeliveryLayout` implements the layouts.

Kafka, retained (``kafka.retained_topic``, compacted): the MQTT exchanges' retained
messages; key = the JSON array ``[exchange, topic]``, value = the retained publish's
payload (null: cleared), headers = its kept headers plus :data:`MESSAGE_ID_HEADER` and
:data:`PUBLISHED_AT_HEADER`. A delivery of a retained message made when a subscription is
applied carries :data:`RETAINED_HEADER`.

Kafka, rejected: the original key, value and headers of a bad publish or a bad
subscription change, plus :data:`REASON_HEADER`, :data:`SOURCE_HEADER`
(``publish`` or ``subscription``) and :data:`MESSAGE_ID_HEADER` (the record's
``<topic>/<partition>/<offset>``).

Delta: ``deliveries`` (one row per message x subscriber), ``messages`` (one row
per publish with its outcome), ``subscriptions`` (every applied change with the
snapshot version it produced); their columns are in :mod:`schemas.tables`.

Plain names only, no Spark or Arrow import: the client verbs and ``bitroute audit``
import this module without starting pyspark (:func:`message_id_column` loads
pyarrow when first called).
"""

from __future__ import annotations

# --- Kafka headers -----------------------------------------------------------
EXCHANGE_HEADER = "exchange"
MESSAGE_ID_HEADER = "bitroute.message_id"
SUBSCRIPTION_IDS_HEADER = "bitroute.subscription_ids"
SNAPSHOT_VERSION_HEADER = "bitroute.snapshot_version"
REASON_HEADER = "bitroute.reason"
SOURCE_HEADER = "bitroute.source"
#: The routing key of a delivery in the shared layout (whose record key is the subscriber).
ROUTING_KEY_HEADER = "bitroute.routing_key"
#: A publish to an MQTT exchange whose last ``retain`` header is :data:`RETAIN_TRUE` is
#: retained: it becomes its topic's retained message, or, with an empty payload, clears it
#: (streaming.router.retained; docs/design.md, "Retained messages"). Its live deliveries keep
#: the header only for a subscription with Retain As Published (compiler.options).
RETAIN_HEADER = "retain"
RETAIN_TRUE = "true"
#: Optional on a publish: who published it (``bitroute publish --publisher NAME``), a
#: subscriber name; its last value is compared with the subscriber of each subscription with
#: No Local (compiler.options), which is not delivered the publish. Kept on deliveries.
PUBLISHER_HEADER = "publisher"
#: MQTT 5's Message Expiry Interval of a publish: whole seconds, 1 to :data:`MAX_EXPIRY_SECONDS`
#: (the last header of the name counts; absent: it never expires). A publish whose lifetime
#: ended before it was routed is delivered to no one (:data:`OUTCOME_EXPIRED`); a delivery's
#: header carries the remaining interval (kernel/core/src/expiry.rs; docs/design.md,
#: "Message expiry"). ``bitroute publish --expiry`` sets it.
EXPIRY_HEADER = "expiry"
MAX_EXPIRY_SECONDS = 4_294_967_295
#: On a delivery of a topic's retained message made when a subscription was applied: the
#: value ``true``; live deliveries do not carry it.
RETAINED_HEADER = "bitroute.retained"
#: On a record of the retained topic: the retained publish's Kafka timestamp (epoch ms,
#: decimal), for the ``published_at`` of its deliveries' audit rows.
PUBLISHED_AT_HEADER = "bitroute.published_at"
#: On a delivery made by a replay (``subscribe --since``, streaming.router.replay.replay): the
#: value ``true``; live deliveries do not carry it.
REPLAYED_HEADER = "bitroute.replayed"
REPLAYED_VALUE = b"true"
#: On a delivery made through an alternate exchange (the publish's own exchange routed it to
#: no one: ``[exchanges.alternates]``): the alternate's name; other deliveries do not carry it.
ALTERNATE_EXCHANGE_HEADER = "bitroute.alternate_exchange"
#: The headers the router puts last on every delivery, in this order (after the publish's
#: own headers, a feature mark such as :data:`REPLAYED_HEADER`, and the routing key of the
#: shared layout): the one statement of their order, which the kernel's delivery writer
#: is handed (streaming.router.batch.delivery.DeliveryColumns).
DELIVERY_ROUTER_HEADERS = (MESSAGE_ID_HEADER, SUBSCRIPTION_IDS_HEADER, SNAPSHOT_VERSION_HEADER)
#: Headers the router adds; a publish carrying one of them has it replaced.
ROUTER_HEADERS = (MESSAGE_ID_HEADER, SUBSCRIPTION_IDS_HEADER, SNAPSHOT_VERSION_HEADER,
                  REASON_HEADER, SOURCE_HEADER, ROUTING_KEY_HEADER, RETAINED_HEADER,
                  PUBLISHED_AT_HEADER, REPLAYED_HEADER, ALTERNATE_EXCHANGE_HEADER)

# --- Delivery topic layouts (kafka.delivery_layout) ---------------------------
LAYOUT_TOPIC_PER_SUBSCRIBER = "topic-per-subscriber"
LAYOUT_SHARED = "shared"
DELIVERY_LAYOUTS = (LAYOUT_TOPIC_PER_SUBSCRIBER, LAYOUT_SHARED)

SOURCE_PUBLISH = "publish"
SOURCE_SUBSCRIPTION = "subscription"

# --- Subscription changelog JSON ---------------------------------------------
#: The fields every changelog value carries, each a string, in this order.
SUBSCRIPTION_REQUIRED_FIELDS = ("exchange", "subscriber", "filter")
#: Optional: an ISO-8601 time (UTC when it names no zone). A record that creates the
#: subscription with it asks for a replay of the publishes Kafka keeps at or after that
#: time (streaming.router.replay.replay); ``bitroute subscribe --since`` writes it.
SUBSCRIPTION_SINCE_FIELD = "since"
#: Optional MQTT subscription options (compiler.options; docs/design.md, "Subscription
#: options"): Retain Handling, the integer 0 (default), 1 or 2; Retain As Published, a boolean.
RETAIN_HANDLING_FIELD = "retain_handling"
RETAIN_AS_PUBLISHED_FIELD = "retain_as_published"
#: Optional MQTT No Local, a boolean: not delivered what the subscriber published itself.
NO_LOCAL_FIELD = "no_local"
SUBSCRIPTION_OPTION_FIELDS = (RETAIN_HANDLING_FIELD, RETAIN_AS_PUBLISHED_FIELD, NO_LOCAL_FIELD)
#: Every field a changelog value may carry (all but the required ones optional, may be null).
SUBSCRIPTION_FIELDS = (*SUBSCRIPTION_REQUIRED_FIELDS, "headers", SUBSCRIPTION_SINCE_FIELD,
                       *SUBSCRIPTION_OPTION_FIELDS)
HEADER_CRITERIA_FIELDS = ("match", "criteria")

# --- Message outcomes (messages.outcome) and change kinds (subscriptions.change)
OUTCOME_ROUTED = "routed"
OUTCOME_UNROUTABLE = "unroutable"
OUTCOME_REJECTED = "rejected"
#: A range of publishes Kafka deleted before the router read them (one row per
#: partition range, message id of its first offset: streaming.router.topics.retention).
OUTCOME_LOST = "lost"
#: A retained publish with an empty payload: it cleared its topic's retained message and
#: is delivered to no one (streaming.router.retained).
OUTCOME_CLEARED = "cleared"
#: A publish whose lifetime (:data:`EXPIRY_HEADER`) ended before it was routed: delivered to
#: no one.
OUTCOME_EXPIRED = "expired"
CHANGE_UPSERT = "upsert"
CHANGE_REMOVE = "remove"
CHANGE_REJECTED = "rejected"


# --- Message ids -----------------------------------------------------------------
#: Between a topic's name and its incarnation number in a message id (never in a topic name).
INCARNATION_SEPARATOR = "~"
#: A message id parsed back: groups ``topic`` (the id's topic part: the topic's name, with
#: ``~<n>`` for incarnation n >= 1), ``partition`` and ``offset`` (decimal, at most 18
#: digits: they fit an int64). Python's ``re``, Arrow's RE2 (``pc.extract_regex``) and
#: DataFusion's ``regexp_match`` read it alike.
MESSAGE_ID_PATTERN = r"^(?P<topic>.*)/(?P<partition>[0-9]{1,18})/(?P<offset>[0-9]{1,18})$"


def message_id_topic(topic: str, incarnation: int = 0) -> str:
    """The topic part of the ids of ``topic``'s incarnation ``incarnation`` (0: the first)."""
    return f"{topic}{INCARNATION_SEPARATOR}{incarnation}" if incarnation else topic


def message_id(topic: str, partition: int, offset: int, incarnation: int = 0) -> str:
    """The id of the Kafka record at ``topic/partition/offset`` of the topic's incarnation
    ``incarnation``."""
    return f"{message_id_topic(topic, incarnation)}/{partition}/{offset}"


def message_id_column(topics, partitions, offsets, incarnation: int = 0):
    """:func:`message_id` of Arrow columns (string, integer, integer), vectorised."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if incarnation:
        topics = pc.binary_join_element_wise(
            topics, pa.scalar(str(incarnation)), INCARNATION_SEPARATOR)
    return pc.binary_join_element_wise(topics, pc.cast(partitions, pa.string()),
                                       pc.cast(offsets, pa.string()), "/")


# --- Delta tables --------------------------------------------------------------
DELIVERIES = "deliveries"
MESSAGES = "messages"
SUBSCRIPTIONS = "subscriptions"

#: Each audit table's partition column: the UTC date of its time column
#: (``routed_at``, ``applied_at``), the last column of its schema
#: (schemas.tables). Tables are partitioned by day so that a time-bounded
#: query reads only its days' files.
PARTITION_COLUMNS = {
    DELIVERIES: "routed_date",
    MESSAGES: "routed_date",
    SUBSCRIPTIONS: "applied_date",
}

#: The time column each partition column is the UTC date of.
PARTITION_SOURCES = {"routed_date": "routed_at", "applied_date": "applied_at"}
AUDIT_TABLE_NAMES = (DELIVERIES, MESSAGES, SUBSCRIPTIONS)
