"""A deliberately straightforward reference matcher: the oracle for tests and
the "naive scan" baseline for the benchmark.

It keeps the subscriptions in a dict and, for every publish, checks every
subscription of the exchange with a word-by-word matcher written straight
from the semantics in docs/design.md (memoised on positions, so several ``#``
cannot blow up). It shares only input validation (the grammar modules) and the
shared-group choice (:mod:`compiler.shared`) with the real index; it shares no
matching code.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

from .dialect import Dialect
from .errors import CompilerError, SubscriptionError, UnknownExchangeError, quote
from .grammar import grammar_for, parse_dialect
from .headers import HeaderCriteria
from .matcher import Delivery
from .shared import choose_member, group_key
from .subscription import Subscription, validate_subscriber
from .text import is_utf8_text


def words_match(filter_words: tuple[str, ...], topic_words: tuple[str, ...], one: str, many: str) -> bool:
    """Whether a filter's words match a topic's words: ``one`` matches exactly
    one word, ``many`` zero or more, any other word itself."""

    @cache
    def match(i: int, j: int) -> bool:
        if i == len(filter_words):
            return j == len(topic_words)
        word = filter_words[i]
        if word == many:
            return any(match(i + 1, k) for k in range(j, len(topic_words) + 1))
        if j == len(topic_words):
            return False
        return (word == one or word == topic_words[j]) and match(i + 1, j + 1)

    return match(0, 0)


class ReferenceMatcher:
    """Same ``upsert``/``remove``/``match`` contract as
    :class:`~compiler.index.RoutingIndex` plus :class:`~compiler.matcher.Matcher`,
    implemented by scanning every subscription."""

    def __init__(self, exchanges: Mapping[str, Dialect | str]) -> None:
        self._exchanges = {name: parse_dialect(d) for name, d in exchanges.items()}
        self._subs: dict[str, Subscription] = {}

    def __len__(self) -> int:
        return len(self._subs)

    def upsert(self, sub: Subscription) -> None:
        """Validate like :meth:`RoutingIndex.upsert` and store ``sub`` by id."""
        if type(sub.id) is not str or not sub.id or not is_utf8_text(sub.id):
            raise SubscriptionError(f"subscription id must be a non-empty UTF-8 string, not {quote(sub.id)}")
        dialect = self._exchanges.get(sub.exchange) if isinstance(sub.exchange, str) else None
        if dialect is None:
            raise UnknownExchangeError(f"subscription {quote(sub.id)}: unknown exchange {quote(sub.exchange)}")
        try:
            validate_subscriber(sub.subscriber)
            grammar_for(dialect).parse_filter(sub.filter)
        except CompilerError as exc:
            raise type(exc)(f"subscription {quote(sub.id)}: {exc}") from None
        if sub.headers is not None and not isinstance(sub.headers, HeaderCriteria):
            raise SubscriptionError(f"subscription {quote(sub.id)}: headers must be HeaderCriteria or None")
        self._subs[sub.id] = sub

    def remove(self, sub_id: str) -> bool:
        return self._subs.pop(sub_id, None) is not None

    def match(
        self,
        exchange: str,
        routing_key: str,
        headers: Mapping[str, str | bytes | None] | None = None,
        message_id: str = "",
    ) -> list[Delivery]:
        dialect = self._exchanges.get(exchange) if isinstance(exchange, str) else None
        if dialect is None:
            raise UnknownExchangeError(f"unknown exchange {quote(exchange)}")
        grammar = grammar_for(dialect)
        topic = tuple(grammar.parse_topic(routing_key))
        headers = headers or {}
        matched: list[Subscription] = []
        for sub in self._subs.values():
            if sub.exchange != exchange:
                continue
            parsed = grammar.parse_filter(sub.filter)
            if grammar.DOLLAR_RULE and routing_key.startswith("$") and parsed.words[0] in (grammar.ONE, grammar.MANY):
                continue
            if not words_match(parsed.words, topic, grammar.ONE, grammar.MANY):
                continue
            if sub.headers is not None and not sub.headers.matches(headers):
                continue
            matched.append(sub)
        groups: dict[str, list[str]] = {}
        for sub in matched:
            if grammar.parse_filter(sub.filter).share_group is not None:
                groups.setdefault(sub.filter, []).append(sub.subscriber)
        chosen = {
            text: choose_member(group_key(exchange, text), message_id, sorted(set(members)))
            for text, members in groups.items()
        }
        by_subscriber: dict[str, list[str]] = {}
        for sub in matched:
            if sub.filter in chosen and chosen[sub.filter] != sub.subscriber:
                continue
            by_subscriber.setdefault(sub.subscriber, []).append(sub.id)
        return [Delivery(name, tuple(sorted(ids))) for name, ids in sorted(by_subscriber.items())]
