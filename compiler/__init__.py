"""bitroute's routing index: topic grammars (AMQP, MQTT), header criteria, an
incremental inverted-bitmap index, versioned snapshots and the matcher.

Pure Python + pyroaring (with numpy/pyarrow/pandas for columns and batches);
no Spark import, so it is unit-testable and reusable outside the stream.
"""

from .cache import MATCH_CACHE_MAX_BYTES, TopicCache
from .dialect import Dialect
from .errors import (
    CompilerError,
    FilterError,
    HeaderCriteriaError,
    HeaderError,
    SnapshotFormatError,
    SubscriptionError,
    TopicError,
    UnknownExchangeError,
)
from .headers import HeaderCriteria
from .index import RoutingIndex
from .matcher import DELIVERIES_TYPE, Delivery, Matcher
from .snapshot import Snapshot
from .subscription import Subscription, validate_subscriber

__all__ = [
    "DELIVERIES_TYPE",
    "MATCH_CACHE_MAX_BYTES",
    "CompilerError",
    "Delivery",
    "Dialect",
    "FilterError",
    "HeaderCriteria",
    "HeaderCriteriaError",
    "HeaderError",
    "Matcher",
    "RoutingIndex",
    "Snapshot",
    "SnapshotFormatError",
    "Subscription",
    "SubscriptionError",
    "TopicCache",
    "TopicError",
    "UnknownExchangeError",
    "validate_subscriber",
]
