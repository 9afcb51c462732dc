"""Alternate exchanges (RabbitMQ's ``alternate-exchange``) on the micro-batch path.

An AMQP exchange may name an alternate, another AMQP exchange
(``[exchanges.alternates]``, :class:`streaming.config.ExchangesConfig`). A publish its own
exchange routes to no one (no error, no delivery) is matched once against the
alternate's subscriptions, with the same routing key, headers and message id; the
alternate's own alternate is not followed, so there are no chains and no loops. The
realtime mode's routing table decides the same in the Rust core
(``kernel/core/src/route.rs``, ``RouteTable::route``); docs/design.md, "Alternate
exchanges", states the contract.

Cost: a batch whose exchanges name no alternate pays one dictionary test; otherwise
one vectorised pass finds the rows routed to no one, and only those are matched again.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .matcher import Matcher


def match_alternates(
    matcher: Matcher,
    alternates: Mapping[str, str],
    message_ids: list,
    exchanges: list,
    keys: list,
    headers: list | None,
    deliveries: pa.ListArray,
    errors: np.ndarray,
) -> tuple[pa.ListArray, list[str | None] | None]:
    """``deliveries`` (:meth:`Matcher.match_columns` of the same columns, ``errors`` its
    reasons) with each row that has none, no error and an exchange naming an alternate
    matched again on that alternate.

    Returns ``(deliveries, via)``: ``via[row]`` is the alternate exchange whose
    subscriptions took row ``row``'s deliveries, None for the others; ``via`` is None
    when no row went through an alternate. A row the alternate routes to no one (or
    refuses) stays as it was.
    """
    if not alternates or not any(e in alternates for e in set(exchanges) if e.__class__ is str):
        return deliveries, None
    empty = pc.equal(pc.list_value_length(deliveries), 0).to_numpy(zero_copy_only=False)
    rows = [row for row in np.flatnonzero(empty).tolist()
            if errors[row] is None and exchanges[row] in alternates]
    if not rows:
        return deliveries, None
    again, again_errors = matcher.match_columns(
        [message_ids[row] for row in rows], [alternates[exchanges[row]] for row in rows],
        [keys[row] for row in rows], None if headers is None else [headers[row] for row in rows])
    took = [j for j, count in enumerate(pc.list_value_length(again).to_pylist())
            if count and again_errors[j] is None]
    if not took:
        return deliveries, None
    n = len(deliveries)
    index = np.arange(n, dtype=np.int64)
    via: list[str | None] = [None] * n
    for j in took:
        row = rows[j]
        index[row] = n + j
        via[row] = alternates[exchanges[row]]
    combined = pa.concat_arrays([deliveries, again.cast(deliveries.type)])
    return combined.take(pa.array(index)), via
