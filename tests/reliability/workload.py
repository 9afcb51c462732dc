"""The campaign's good traffic, with its expected deliveries known by construction.

Three exchanges: ``amq.topic`` and ``other`` (AMQP) and ``mqtt`` (MQTT). Every
routing key has three levels, ``k.<a>.<b>`` (AMQP) or ``k/<a>/<b>`` (MQTT),
``a < A_VALUES``, ``b < B_VALUES``. Each subscription belongs to one exchange
and one of ``SUBSCRIBERS`` subscribers, with one filter shape:

=============  ==========================  =====================  =======
kind           AMQP filter                 MQTT filter            share
=============  ==========================  =====================  =======
exact          ``k.a.b``                   ``k/a/b``              55%
a-wide         ``k.a.*`` or ``k.a.#``      ``k/a/+``, ``k/a/#``   15%
b-wide         ``k.*.b``                   ``k/+/b``              2%
dead           ``z.a.b``                   ``z/a/b``              28%
=============  ==========================  =====================  =======

and 20% of them carry the header criterion ``tier=gold`` (``match=all``). A
publish is (exchange, a, b, gold): its expected subscribers are the union of
the exact, a-wide and b-wide subscriptions of its own exchange whose criteria
hold, which :meth:`Workload.expected` computes from three dictionaries; the
``other`` exchange holds the same kinds of filters as ``amq.topic`` for
different subscriptions, so a cross-exchange delivery shows up as an
unexpected pair. :meth:`Workload.check_oracle` compares that construction
with :class:`compiler.reference.ReferenceMatcher` on a sample of publishes.

About 2 deliveries per publish with the defaults (3,000 subscriptions, 300
subscribers). Deterministic for a given seed.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from compiler.reference import ReferenceMatcher
from compiler.subscription import Subscription

EXCHANGES = {"amq.topic": "amqp", "other": "amqp", "mqtt": "mqtt"}
"""Exchange -> dialect of the campaign (``other`` is set with ``--set exchanges.dialects.other=amqp``)."""
A_VALUES = 100
B_VALUES = 20
GOLD_SHARE = 0.2
TIER_HEADER = "tier"
KINDS = (("exact", 0.55), ("a-wide", 0.70), ("b-wide", 0.72), ("dead", 1.0))
#: A few valid but unusual subscriber names, so that good traffic covers the edges of the grammar.
ODD_SUBSCRIBERS = ("a..b", "-x-", "_", "UPPER.lower-9", "s" * 200)


@dataclass(frozen=True)
class Publish:
    """One good publish: where it goes and what it carries."""

    exchange: str
    a: int
    b: int
    gold: bool

    def key(self) -> str:
        sep = "/" if EXCHANGES[self.exchange] == "mqtt" else "."
        return sep.join(("k", str(self.a), str(self.b)))

    def headers(self) -> list[tuple[str, bytes]]:
        return [("exchange", self.exchange.encode())] + (
            [(TIER_HEADER, b"gold")] if self.gold else [])


@dataclass
class Workload:
    """Subscriptions (id, exchange, subscriber, filter, gold-only) and a publish generator."""

    seed: int
    subscribers: list[str]
    subscriptions: list[tuple[str, str, str, str, bool]]
    _exact: dict = field(default_factory=dict, repr=False)
    _a_wide: dict = field(default_factory=dict, repr=False)
    _b_wide: dict = field(default_factory=dict, repr=False)
    _expected: dict = field(default_factory=dict, repr=False)

    @classmethod
    def generate(cls, subscriptions: int = 3000, subscribers: int = 300, seed: int = 1) -> Workload:
        rng = random.Random(seed)
        names = [f"s{i:04d}" for i in range(max(1, subscribers - len(ODD_SUBSCRIBERS)))]
        names += list(ODD_SUBSCRIBERS)[:max(0, subscribers - len(names))]
        subs = []
        for i in range(subscriptions):
            exchange = rng.choice(sorted(EXCHANGES))
            mqtt = EXCHANGES[exchange] == "mqtt"
            sep = "/" if mqtt else "."
            one, many = ("+", "#") if mqtt else ("*", "#")
            a, b = rng.randrange(A_VALUES), rng.randrange(B_VALUES)
            r = rng.random()
            kind = next(name for name, bound in KINDS if r < bound)
            words = {"exact": ("k", str(a), str(b)),
                     "a-wide": ("k", str(a), rng.choice((one, many))),
                     "b-wide": ("k", one, str(b)),
                     "dead": ("z", str(a), str(b))}[kind]
            subs.append((f"sub-{i:06d}", exchange, names[i % len(names)], sep.join(words),
                         rng.random() < GOLD_SHARE))
        w = cls(seed, names, subs)
        w._index()
        return w

    def _index(self) -> None:
        for _, exchange, subscriber, filt, gold in self.subscriptions:
            words = filt.replace("/", ".").split(".")
            if words[0] != "k":
                continue
            entry = (subscriber, gold)
            if words[1] in ("*", "+"):
                self._b_wide.setdefault((exchange, int(words[2])), []).append(entry)
            elif words[2] in ("*", "+", "#"):
                self._a_wide.setdefault((exchange, int(words[1])), []).append(entry)
            else:
                self._exact.setdefault((exchange, int(words[1]), int(words[2])), []).append(entry)

    def changelog_records(self) -> list[tuple[bytes, bytes]]:
        """The subscriptions as changelog (key, value) records."""
        return [(sid.encode(), changelog_value(exchange, subscriber, filt, gold))
                for sid, exchange, subscriber, filt, gold in self.subscriptions]

    def publishes(self, n: int, seed: int | None = None) -> PublishStream:
        return PublishStream(n, self.seed if seed is None else seed)

    def expected(self, p: Publish) -> tuple[str, ...]:
        """The subscribers ``p`` must reach, sorted."""
        known = self._expected.get(p)
        if known is not None:
            return known
        found: set[str] = set()
        for entries in (self._exact.get((p.exchange, p.a, p.b), ()),
                        self._a_wide.get((p.exchange, p.a), ()),
                        self._b_wide.get((p.exchange, p.b), ())):
            found.update(s for s, gold in entries if p.gold or not gold)
        known = self._expected[p] = tuple(sorted(found))
        return known

    def check_oracle(self, samples: int = 300) -> int:
        """Compare :meth:`expected` with the reference matcher on ``samples`` publishes;
        return how many disagree (0 when the construction is right)."""
        reference = ReferenceMatcher(EXCHANGES)
        for sid, exchange, subscriber, filt, gold in self.subscriptions:
            reference.upsert(Subscription.from_changelog(
                sid.encode(), changelog_value(exchange, subscriber, filt, gold)))
        wrong = 0
        for p in self.publishes(samples, seed=self.seed + 7):
            got = reference.match(p.exchange, p.key(), {k: v for k, v in p.headers()})
            wrong += tuple(sorted(d.subscriber for d in got)) != self.expected(p)
        return wrong


class PublishStream:
    """``n`` publishes drawn uniformly over exchanges, keys and tiers (deterministic)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.seed = seed

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        rng = random.Random(self.seed * 7919 + 1)
        exchanges = sorted(EXCHANGES)
        for _ in range(self.n):
            yield Publish(rng.choice(exchanges), rng.randrange(A_VALUES), rng.randrange(B_VALUES),
                          rng.random() < 0.5)


def changelog_value(exchange: str, subscriber: str, filt: str, gold: bool = False) -> bytes:
    value: dict = {"exchange": exchange, "subscriber": subscriber, "filter": filt}
    if gold:
        value["headers"] = {"match": "all", "criteria": {TIER_HEADER: "gold"}}
    return json.dumps(value).encode()
