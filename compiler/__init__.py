"""bitroute's routing index: topic grammars (AMQP, MQTT), header criteria, an
incremental index of subscriptions, versioned snapshots and the matcher (a trie
of the topic filters in the Rust kernel, header criteria as inverted bitmaps).

Python + pyroaring (with numpy/pyarrow for columns and batches) over
the Rust matching kernel (``bitroute_kernel``, kernel/); no Spark import, so
it is unit-testable and reusable outside the stream.

The names below are imported on first use (PEP 562), so that importing one
light submodule, such as :mod:`compiler.offline` for ``bitroute match``,
does not load numpy, pyarrow and pyroaring.
"""

from __future__ import annotations

from importlib import import_module

_EXPORTS = {
    "MATCH_CACHE_MAX_BYTES": "cache",
    "TopicCache": "cache",
    "Dialect": "dialect",
    "CompilerError": "errors",
    "FilterError": "errors",
    "HeaderCriteriaError": "errors",
    "HeaderError": "errors",
    "InputFileError": "errors",
    "SnapshotFormatError": "errors",
    "SubscriptionError": "errors",
    "TopicError": "errors",
    "UnknownExchangeError": "errors",
    "HeaderCriteria": "headers",
    "RoutingIndex": "index",
    "DELIVERIES_TYPE": "matcher",
    "Delivery": "matcher",
    "Matcher": "matcher",
    "Snapshot": "snapshot",
    "Subscription": "subscription",
    "validate_subscriber": "subscription",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
