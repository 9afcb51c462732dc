"""Shared fixtures: a matcher and its reference oracle over the same subscriptions.

Test modules here are imported by basename (no packages), so helpers are
handed out as fixtures rather than imported.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from compiler import Matcher, RoutingIndex, Subscription
from compiler.reference import ReferenceMatcher
from route_tables import ROUTED, UNROUTABLE, header_list, route_table

EXCHANGES = {"amq": "amqp", "mq": "mqtt"}


class Routing:
    """A RoutingIndex, its Matcher, the ReferenceMatcher and the realtime mode's
    RouteTable over the same subscriptions."""

    def __init__(self, subs: Iterable[Subscription], exchanges=EXCHANGES) -> None:
        subs = list(subs)
        self.index = RoutingIndex(exchanges)
        self.reference = ReferenceMatcher(exchanges)
        for sub in subs:
            self.index.upsert(sub)
            self.reference.upsert(sub)
        self.matcher = Matcher(self.index.snapshot(1, {}))
        self.route_table = route_table(subs, exchanges, next(iter(exchanges)))

    def ids(self, exchange: str, topic: str, headers=None, message_id: str = "") -> list[str]:
        """Matched subscription ids, after checking the matcher agrees with the
        reference and with the RouteTable (the realtime mode's matching)."""
        got = self.matcher.match(exchange, topic, headers, message_id)
        assert got == self.reference.match(exchange, topic, headers, message_id)
        outcome, _, _, reason, deliveries, _ = self.route_table.route(
            topic.encode(), [("exchange", exchange.encode()), *header_list(headers)], message_id)
        assert (outcome, reason) == ((ROUTED, None) if got else (UNROUTABLE, None))
        assert [(s, tuple(ids)) for s, _, ids in deliveries] == [tuple(d) for d in got]
        return sorted(i for d in got for i in d.subscription_ids)


@pytest.fixture
def amqp_routing():
    """``amqp_routing(*filters)``: subscription ``s<i>`` of subscriber ``c<i>`` per filter, exchange ``amq``."""
    return lambda *filters: Routing([Subscription(f"s{i}", "amq", f"c{i}", f) for i, f in enumerate(filters)])


@pytest.fixture
def mqtt_routing():
    """``mqtt_routing(*filters)``: subscription ``s<i>`` of subscriber ``c<i>`` per filter, exchange ``mq``."""
    return lambda *filters: Routing([Subscription(f"s{i}", "mq", f"c{i}", f) for i, f in enumerate(filters)])


@pytest.fixture
def routing():
    """``routing(subscriptions)``: a :class:`Routing` over both test exchanges."""
    return Routing
