"""bitroute's topic-matching kernel (Rust, ``kernel/src``): the typed face of
the extension module, installed with it (maturin ships this file and
``py.typed``). ``compiler.matcher.Matcher`` and ``compiler.offline`` are the
matching kernel's callers, ``streaming.router.batch.delivery.DeliveryProducer`` the
delivery writer's; see kernel/src/lib.rs for what it does. :class:`RouteTable` is
the realtime mode's routing table (kernel/core/src/route.rs), the one its JNI
library routes with, here for tests that hold it against the micro-batch path.

Slot arrays are int64 numpy arrays (any contiguous int64 buffer); results
named "bytes of int64" are native-endian int64 values (``np.frombuffer``).
The objects handed in are protocols of read-only attributes (the kernel reads
them; frozen dataclasses satisfy them); a ``Sequence`` argument is any sequence
(pyo3 copies it into a ``Vec``), a ``list`` one must be a list.
"""

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

class KernelError(Exception):
    """Root of every exception the kernel raises."""

class TableError(KernelError):
    """The tables or arrays handed to the kernel are inconsistent (a length,
    a slot or exchange number out of range, a string column that is not
    UTF-8, an unknown dialect): a caller's bug or a malformed snapshot,
    never a bad publish."""

class ColumnOverflowError(KernelError):
    """A batch's deliveries column would exceed Arrow's 32-bit offsets: the
    batch must be matched in smaller parts."""

class StringColumn(Protocol):
    """``compiler.columns.StringColumn``: string ``i`` is
    ``data[offsets[i]:offsets[i + 1]]``."""

    @property
    def offsets(self) -> np.ndarray: ...  # int64, one more than the strings
    @property
    def data(self) -> np.ndarray: ...  # uint8

class Grammar(Protocol):
    """``compiler.grammar.KernelGrammar``: an exchange's dialect and the
    prefix of its shared subscriptions (``None``: it has none)."""

    @property
    def dialect(self) -> str: ...  # "amqp" or "mqtt"
    @property
    def share_prefix(self) -> str | None: ...

class SubscriberRule(Protocol):
    """``compiler.subscription.SUBSCRIBER_RULE``."""

    @property
    def characters(self) -> str: ...  # the ASCII characters a subscriber name may hold
    @property
    def max_chars(self) -> int: ...
    @property
    def reserved(self) -> Sequence[str]: ...  # names it must not be

class Tables(Protocol):
    """``compiler.tables.KernelTables`` (its docstring defines each table)."""

    @property
    def delivery_type(self) -> type[tuple]: ...
    @property
    def names(self) -> list[str | None]: ...
    @property
    def name_text(self) -> StringColumn: ...
    @property
    def ids(self) -> StringColumn: ...
    @property
    def rank(self) -> np.ndarray: ...
    @property
    def owners(self) -> np.ndarray: ...
    @property
    def filter_start(self) -> np.ndarray: ...
    @property
    def filter_count(self) -> np.ndarray: ...
    @property
    def filter_slots(self) -> np.ndarray: ...
    @property
    def special(self) -> np.ndarray: ...  # uint8
    @property
    def grammars(self) -> Sequence[Grammar]: ...
    @property
    def filter_text(self) -> StringColumn: ...
    @property
    def filter_exchange(self) -> np.ndarray: ...
    @property
    def hit_code(self) -> np.ndarray: ...

class Kernel:
    """The matching kernel of one snapshot: per exchange, an exact-filter map
    and a trie of the wildcard filters. Exchanges are numbered as in
    ``tables.grammars``; a number out of range raises :class:`TableError`."""

    def __init__(self, tables: Tables) -> None:
        """Raises :class:`TableError` for inconsistent tables."""

    def deliveries(self, exchange: int, topic: object) -> tuple[Any, ...] | None:
        """The finished deliveries (``delivery_type`` tuples, by subscriber)
        of one topic, or ``None`` when the Python side must answer: not a
        valid str topic, or a hit of a filter with per-message conditions."""

    def ordered_slots(self, codes: Sequence[int]) -> list[int]:
        """The subscription slots of hit codes, conditions ignored, in
        (subscriber, id) order."""

    def slot_deliveries(self, slots: Sequence[int]) -> tuple[Any, ...]:
        """The deliveries of subscription slots already in output order."""

    def hits(self, exchange: int, words: Sequence[str]) -> list[int]:
        """The hit codes of a topic the Python grammar validated and split."""

    def match_topics(self, exchange: int, topics: list[str]) -> tuple[bytes, bytes, list[int], list[int]]:
        """``(flat, offsets, unhandled, special)`` for distinct topics: topic
        ``t``'s slots in output order are ``flat[offsets[t]:offsets[t + 1]]``
        (bytes of int64); ``unhandled``: invalid topics; ``special``: hits of
        filters with per-message conditions (neither has slots in ``flat``)."""

    def match_keys(self, exchange: int, keys: list[bytes | str | None]) -> tuple[bytes, bytes, bytes]:
        """``(row_topic, flat, offsets)``, bytes of int64, for a batch's routing
        keys: row ``r``'s slots are ``flat[offsets[t]:offsets[t + 1]]`` for
        ``t = row_topic[r]``, -1 for a row the Python side must answer."""

    def layout(self, row_unit: np.ndarray, flat: np.ndarray, offsets: np.ndarray) -> list[bytes]:
        """The six Arrow buffers of a batch's deliveries column (see
        ``compiler.output.deliveries_column``). Raises
        :class:`ColumnOverflowError` past Arrow's 32-bit offsets."""

class BinaryColumn(Protocol):
    """``streaming.router.batch.delivery.BinaryColumn``: value ``i`` is
    ``data[offsets[i]:offsets[i + 1]]``, null where ``valid[i]`` is 0."""

    @property
    def offsets(self) -> np.ndarray: ...  # int32, one more than the values
    @property
    def data(self) -> np.ndarray: ...  # uint8
    @property
    def valid(self) -> np.ndarray: ...  # uint8, empty: no value is null

class DeliveryColumns(Protocol):
    """``streaming.router.batch.delivery.DeliveryColumns`` (its docstring defines each)."""

    @property
    def topics(self) -> BinaryColumn: ...
    @property
    def rows(self) -> np.ndarray: ...  # int64
    @property
    def keys(self) -> BinaryColumn: ...
    @property
    def keys_per_delivery(self) -> bool: ...
    @property
    def routing_keys(self) -> BinaryColumn: ...
    @property
    def routing_key_header(self) -> str | None: ...
    @property
    def values(self) -> BinaryColumn: ...
    @property
    def header_offsets(self) -> np.ndarray: ...  # int32
    @property
    def header_names(self) -> BinaryColumn: ...
    @property
    def header_values(self) -> BinaryColumn: ...
    @property
    def message_ids(self) -> BinaryColumn: ...
    @property
    def subscription_ids(self) -> BinaryColumn: ...
    @property
    def version(self) -> bytes: ...
    @property
    def header_names_router(self) -> tuple[str, str, str]: ...

class DeliveryWriter:
    """``shards`` idempotent librdkafka producers of one configuration; a
    topic is written by one of them (a hash of its name). Nothing the
    configuration holds appears in a message: librdkafka's own error text is
    given with each of ``secrets`` replaced by ``*****``."""

    def __init__(self, config: Sequence[tuple[str, str]], shards: int, secrets: Sequence[str]) -> None:
        """Raises :class:`KernelError` for a property librdkafka refuses."""

    def produce(self, columns: DeliveryColumns) -> int:
        """Queue one record per delivery (GIL released; a full queue is
        served and the record queued again); returns this call's epoch.
        Raises :class:`KernelError` for inconsistent columns."""

    def flush(self, timeout_ms: int) -> int:
        """Flush every busy producer at once for at most ``timeout_ms``
        (GIL released); the records left."""

    def take_events(self) -> tuple[list[tuple[int, int, int]], list[tuple[int, str]], list[tuple[int, str, str]]]:
        """What the producers reported since the last call: failed records
        ``(epoch, index, librdkafka error code)``, client errors
        ``(code, reason)``, log lines ``(syslog level, facility, text)``."""

class OfflineOutput(Iterator[bytes]):
    """The output lines of ``bitroute match``, a block of ASCII lines at a time."""

    def __iter__(self) -> OfflineOutput: ...
    def __next__(self) -> bytes: ...

def expiry_states(values: Sequence[bytes | None], published_ms: Sequence[int], now_ms: int) -> list[int | str]:
    """Message expiry (kernel/core/src/expiry.rs) of publishes whose last ``expiry``
    header is ``values[i]`` (None: a null value) and Kafka timestamp ``published_ms[i]``,
    routed at ``now_ms`` (epoch ms): the remaining interval in seconds (>= 1), 0 when
    expired, or the reason the value is not an interval."""

def offline_match(
    subscriptions: bytes, topics: bytes, grammar: Grammar, subscribers: SubscriberRule
) -> OfflineOutput | None:
    """``bitroute match`` of two files' bytes, or ``None`` when the Python
    reference path must answer (see kernel/src/offline.rs)."""

class RouteTable:
    """The realtime mode's routing table (kernel/core/src/route.rs): built from
    the table JSON of the realtime contract (section 2), it routes one publish
    exactly as the micro-batch path does (``PublishColumns``, ``Matcher``,
    ``subscription_ids_json``). Immutable."""

    def __init__(self, table_json: bytes) -> None:
        """Raises :class:`TableError` for a table it cannot read (malformed
        JSON, an unknown dialect or exchange, a repeated id)."""

    @property
    def version(self) -> int | None:
        """The table's ``version`` (informational)."""

    def __len__(self) -> int:
        """The number of subscriptions."""

    def route(
        self, key: bytes | None, headers: Sequence[tuple[str, bytes | None]], message_id: str
    ) -> tuple[int, str | None, str | None, str | None, list[tuple[str, str, list[str]]],
               str | None]:
        """``(outcome, exchange, routing_key, reason, deliveries, alternate)`` of the publish
        with record key ``key``, Kafka headers ``headers`` (in order) and id
        ``message_id`` (``<topic>/<partition>/<offset>``, for shared groups).
        ``outcome``: 0 routed, 1 unroutable, 2 rejected (``reason`` set, no
        deliveries); ``exchange`` None when the exchange header was null or
        not UTF-8; ``routing_key`` None when absent or not UTF-8;
        ``deliveries``: ``(subscriber, ids_header, ids)`` by subscriber, ids in
        order, ``ids_header`` the ``bitroute.subscription_ids`` header value;
        ``alternate``: the alternate exchange whose subscriptions took the
        deliveries, its own exchange routing it to no one (None otherwise)."""

    def route_at(
        self, key: bytes | None, headers: Sequence[tuple[str, bytes | None]], message_id: str,
        published_ms: int, now_ms: int,
    ) -> tuple[tuple[int, str | None, str | None, str | None, list[tuple[str, str, list[str]]],
                     str | None], int | None]:
        """``(route(...), remaining)`` with the publish's expiry applied (its Kafka
        timestamp ``published_ms``, routed at ``now_ms``, epoch ms): an invalid
        ``expiry`` header rejects it, an expired publish is outcome 3 with no
        deliveries, and ``remaining`` is the interval (seconds) a live one's
        deliveries carry in their ``expiry`` headers (None: no expiry header)."""
