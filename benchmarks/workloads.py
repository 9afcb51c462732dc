"""Workload generators for the compiler benchmark.

Two profiles, both deterministic for a given (n, seed):

``fanout`` (AMQP)
    The shape of Erlang Solutions' RabbitMQ topic-exchange study: every level
    of a binding key is a word with probability 0.70, '*' with 0.20 and '#'
    with 0.10.  Binding keys have 3-7 levels, routing keys 3-7 words, every
    word drawn from a vocabulary of FANOUT_VOCAB words per level.  Wildcards
    are dense, so a publish matches a fixed fraction of all subscriptions:
    thousands of matches per topic at 1M subscriptions.  Subscribers (queues)
    hold ~100 subscriptions each at 1M (FANOUT_SUBS_PER_SUBSCRIBER).

``devices`` (MQTT)
    Telemetry topics ``site<s>/dev<d>/<metric>``: DEVICES_PER_SITE devices per
    site, METRICS metric names, and as many sites as make the topic space
    about N topics.  Filters are mostly exact (a client following one
    device metric) or carry one wildcard:

        91.45%  site/dev/metric     exact
         8.00%  site/dev/+          every metric of one device
         0.50%  site/+/metric       one metric across a site
         0.05%  site/#              a whole site

    so a topic is matched by about 0.9 + 0.6 + 1.25 + 1 = 3.8 subscriptions
    on average (Poisson-ish, 1-10 for almost every topic), independently of
    N.  DEVICE_SUBSCRIBERS (1000) subscribers, drawn uniformly.

Publishes are Zipf distributed (exponent ZIPF_S) over the topic space, with
popularity ranks assigned by a seeded random permutation.  The cold
measurement uses distinct topics drawn uniformly from the same space.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

ZIPF_S = 1.0

FANOUT_VOCAB = 8
FANOUT_FILTER_LEVELS = (3, 7)
FANOUT_TOPIC_LEVELS = (3, 7)
FANOUT_TOPIC_SPACE = 200_000
FANOUT_SUBS_PER_SUBSCRIBER = 100
FANOUT_MIN_SUBSCRIBERS = 1000

DEVICES_PER_SITE = 250
METRICS = ("temp", "humidity", "pressure", "power", "voltage", "current", "rpm", "status")
DEVICE_SUBSCRIBERS = 1000
DEVICE_MIX = (  # (kind, cumulative probability)
    ("exact", 0.9145),
    ("device+", 0.9945),
    ("site+metric", 0.9995),
    ("site#", 1.0),
)


@dataclass
class Workload:
    profile: str
    dialect: str  # "amqp" | "mqtt"
    exchange: str
    subs: list[tuple[str, str, str]]  # (id, subscriber, filter)
    topic_space: list[str]  # ranked: index 0 is the most popular topic
    description: str
    _cdf: np.ndarray | None = field(default=None, repr=False)

    @property
    def n(self) -> int:
        return len(self.subs)

    @property
    def subscribers(self) -> int:
        return len({s for _, s, _ in self.subs})

    def zipf_topics(self, rng: np.random.Generator, size: int) -> list[str]:
        """``size`` publishes, Zipf(ZIPF_S) over the ranked topic space."""
        if self._cdf is None:
            ranks = np.arange(1, len(self.topic_space) + 1, dtype=np.float64)
            w = ranks ** -ZIPF_S
            cdf = np.cumsum(w)
            self._cdf = cdf / cdf[-1]
        idx = np.searchsorted(self._cdf, rng.random(size), side="right")
        idx = np.minimum(idx, len(self.topic_space) - 1)
        space = self.topic_space
        return [space[i] for i in idx.tolist()]

    def distinct_topics(self, rng: random.Random, k: int) -> list[str]:
        """``k`` distinct topics drawn uniformly from the topic space."""
        k = min(k, len(self.topic_space))
        return rng.sample(self.topic_space, k)


def fanout(n: int, seed: int) -> Workload:
    rng = random.Random(f"fanout/{n}/{seed}")
    vocab = [[f"w{lvl}{i}" for i in range(FANOUT_VOCAB)] for lvl in range(max(FANOUT_TOPIC_LEVELS[1], FANOUT_FILTER_LEVELS[1]))]
    subscribers = max(FANOUT_MIN_SUBSCRIBERS, n // FANOUT_SUBS_PER_SUBSCRIBER)
    subscribers = min(subscribers, n)
    lo, hi = FANOUT_FILTER_LEVELS
    rand, randint, choice = rng.random, rng.randint, rng.choice
    subs = []
    for i in range(n):
        words = []
        for lvl in range(randint(lo, hi)):
            r = rand()
            if r < 0.70:
                words.append(choice(vocab[lvl]))
            elif r < 0.90:
                words.append("*")
            else:
                words.append("#")
        subs.append((f"f{i}", f"q{randint(0, subscribers - 1)}", ".".join(words)))
    tlo, thi = FANOUT_TOPIC_LEVELS
    space_size = sum(FANOUT_VOCAB ** k for k in range(tlo, thi + 1))
    target = min(FANOUT_TOPIC_SPACE, space_size)
    seen: set[str] = set()
    space: list[str] = []
    while len(space) < target:
        t = ".".join(choice(vocab[lvl]) for lvl in range(randint(tlo, thi)))
        if t not in seen:
            seen.add(t)
            space.append(t)
    return Workload(
        profile="fanout",
        dialect="amqp",
        exchange="events",
        subs=subs,
        topic_space=space,
        description=(
            f"AMQP; binding levels 70% word / 20% '*' / 10% '#', {lo}-{hi} levels, "
            f"{FANOUT_VOCAB} words per level; routing keys {tlo}-{thi} words; "
            f"{subscribers} subscribers; {len(space)} topics, Zipf s={ZIPF_S}"
        ),
    )


def devices(n: int, seed: int) -> Workload:
    rng = random.Random(f"devices/{n}/{seed}")
    per_site = DEVICES_PER_SITE * len(METRICS)
    sites = max(1, round(n / per_site))
    site_names = [f"site{s}" for s in range(sites)]
    dev_names = [f"dev{d}" for d in range(DEVICES_PER_SITE)]
    space = [f"{s}/{d}/{m}" for s in site_names for d in dev_names for m in METRICS]
    rng.shuffle(space)  # popularity rank = position
    subscribers = min(DEVICE_SUBSCRIBERS, n)
    rand, randint, choice = rng.random, rng.randint, rng.choice
    subs = []
    for i in range(n):
        r = rand()
        s = choice(site_names)
        if r < DEVICE_MIX[0][1]:
            filt = f"{s}/{choice(dev_names)}/{choice(METRICS)}"
        elif r < DEVICE_MIX[1][1]:
            filt = f"{s}/{choice(dev_names)}/+"
        elif r < DEVICE_MIX[2][1]:
            filt = f"{s}/+/{choice(METRICS)}"
        else:
            filt = f"{s}/#"
        subs.append((f"d{i}", f"app{randint(0, subscribers - 1)}", filt))
    return Workload(
        profile="devices",
        dialect="mqtt",
        exchange="telemetry",
        subs=subs,
        topic_space=space,
        description=(
            f"MQTT; site/dev/metric, {sites} sites x {DEVICES_PER_SITE} devices x "
            f"{len(METRICS)} metrics; filters 91.45% exact, 8% site/dev/+, "
            f"0.5% site/+/metric, 0.05% site/#; {subscribers} subscribers; "
            f"{len(space)} topics, Zipf s={ZIPF_S}"
        ),
    )


PROFILES = {"fanout": fanout, "devices": devices}
