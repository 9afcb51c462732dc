"""The realtime mode's routing table (``bitroute_kernel.RouteTable``, the Rust core the JNI
library routes with) beside the micro-batch path, for tests that hold one against the
other without a JVM: the table JSON of a set of subscriptions (the realtime contract,
section 2), and a publish's outcome as each path decides it, in one shape:
``(outcome, exchange, routing_key, reason, [(subscriber, ids_header, [ids])], alternate)``,
outcome 0 routed, 1 unroutable, 2 rejected, alternate the alternate exchange that took the
deliveries (None: the publish's own exchange did)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

import pyarrow as pa
from bitroute_kernel import RouteTable

from arrow_batches import source_batch
from compiler import Matcher, Subscription
from compiler.alternates import match_alternates
from compiler.grammar import grammar_for, parse_dialect
from streaming.kafka.records import PublishColumns, subscription_ids_json

ROUTED, UNROUTABLE, REJECTED = 0, 1, 2

Headers = list[tuple[str, bytes | None]]


def table_json(subs: Iterable[Subscription], exchanges: Mapping[str, str], default_exchange: str,
               version: int = 1, alternates: Mapping[str, str] | None = None) -> bytes:
    """The routing table JSON of valid subscriptions ``subs`` (``alternates``: each
    exchange's alternate exchange)."""
    return json.dumps({
        "version": version,
        "default_exchange": default_exchange,
        "exchanges": [{"name": name, "dialect": parse_dialect(d).value,
                       "share_prefix": grammar_for(parse_dialect(d)).SHARE_PREFIX,
                       "alternate": (alternates or {}).get(name)}
                      for name, d in exchanges.items()],
        "subscriptions": [{"id": s.id, "exchange": s.exchange, "subscriber": s.subscriber,
                           "filter": s.filter, "headers": s.headers.to_json() if s.headers else None,
                           **({"no_local": True} if s.options.no_local else {})}
                          for s in subs],
    }).encode()


def route_table(subs: Iterable[Subscription], exchanges: Mapping[str, str], default_exchange: str,
                alternates: Mapping[str, str] | None = None) -> RouteTable:
    return RouteTable(table_json(subs, exchanges, default_exchange, alternates=alternates))


def micro_batch(matcher: Matcher, default_exchange: str, publishes: list[tuple[bytes | None, Headers]],
                alternates: Mapping[str, str] | None = None) -> list[tuple]:
    """What the micro-batch path (``streaming.router.batch.routing.plan_batch``: ``PublishColumns``,
    ``Matcher.match_columns``, ``match_alternates``, ``subscription_ids_json``) decides for each publish
    ``(key, headers)`` of a batch of topic ``p``, partition 0, offsets from 0 (message
    ids ``p/0/<offset>``). The routing key is its text, or None when absent or not UTF-8."""
    if not publishes:
        return []
    batch = source_batch([(key, b"payload", headers) for key, headers in publishes])
    columns = PublishColumns(batch, default_exchange)
    ids, keys, header_lists = columns.message_ids.to_pylist(), columns.keys.to_pylist(), \
        columns.header_lists()
    deliveries, errors = matcher.match_columns(ids, columns.exchanges, keys, header_lists)
    deliveries, via = match_alternates(matcher, alternates or {}, ids, columns.exchanges, keys,
                                       header_lists, deliveries, errors)
    via = via or [None] * len(publishes)
    reasons = errors.tolist()
    for row, reason in columns.exchange_errors.items():
        reasons[row] = reason
    entries = deliveries.flatten()
    ids_json = subscription_ids_json(entries.flatten()[1]).to_pylist() if len(entries) else []
    regrouped = pa.ListArray.from_arrays(deliveries.offsets, pa.array(ids_json, pa.string()))
    out: list[tuple] = []
    for (key, _), exchange, reason, row, headers_json, alternate in zip(
            publishes, columns.exchanges, reasons, deliveries.to_pylist(), regrouped.to_pylist(),
            via, strict=True):
        # As the audit shows a routing key (streaming.kafka.records.text).
        routing_key = None if key is None else key.decode("utf-8", "backslashreplace")
        if reason is not None:
            out.append((REJECTED, exchange, routing_key, reason, [], None))
            continue
        found = [(d["subscriber"], h, list(d["subscription_ids"])) for d, h in zip(row, headers_json, strict=True)]
        out.append((ROUTED if found else UNROUTABLE, exchange, routing_key, None, found, alternate))
    return out


def realtime(table: RouteTable, publishes: list[tuple[bytes | None, Headers]]) -> list[tuple]:
    """What the routing table decides for the same publishes (message ids as :func:`micro_batch`)."""
    return [table.route(key, headers, f"p/0/{offset}") for offset, (key, headers) in enumerate(publishes)]


def header_list(headers: Mapping[str, str | bytes | None] | None) -> Headers:
    """``Matcher.match``'s headers mapping as Kafka header entries."""
    return [(k, v.encode() if isinstance(v, str) else v) for k, v in (headers or {}).items()]
