"""The benchmarks' workloads: subscriptions and publishes, deterministic for a given
(profile, n, seed).

Two families, each with a ``devices`` and a ``fanout`` profile:

- :data:`PROFILES` (:class:`Workload`): the end-to-end scenarios' (``e2e``, ``soak``,
  ``batch-cycle``, ``route-task``, ...): MQTT filters and a list of publishes, the same
  for bitroute, Kafka Streams, RabbitMQ and Mosquitto;
- :data:`RANKED_PROFILES` (:class:`RankedWorkload`): the ``compiler`` scenario's: a
  ranked topic space that publishes draw from with a Zipf law, and distinct topics for
  the cold measurement.

End to end
----------
Workloads of the end-to-end benchmark: the same subscriptions and publishes for
bitroute, RabbitMQ and Mosquitto, deterministic for a given (profile, n, seed).

Both profiles are MQTT filters over ``/``-separated topics, so that all three
systems run the same workload; RabbitMQ gets them translated (:func:`amqp_binding`:
``/`` -> ``.``, ``+`` -> ``*``, ``#`` -> ``#``, which keeps the semantics: MQTT
``a/#`` matches ``a`` as AMQP ``a.#`` does).

``devices``
    Telemetry topics ``site<s>/dev<d>/<metric>``: SITE_DEVICES devices per site,
    len(METRICS) metrics, one site per SUBS_PER_SITE subscriptions, so the
    topic space grows with N and the deliveries per publish do not. Filters:

        60%  site/dev/metric    exact
        25%  site/dev/+         every metric of one device
        10%  site/+/metric      one metric across a site
         5%  site/#             a whole site
        CATCH_ALLS filters      #, +/#, +/+/+, +/+/#  (one subscriber each)

    Expected matches per publish: 0.6*50/200 + 0.25*50/25 + 0.1*50/8 + 0.05*50
    + 4 = 0.15 + 0.5 + 0.63 + 2.5 + 4 = 7.8 subscriptions, ~7.6 distinct
    subscribers (DEVICE_SUBSCRIBERS = 1000, drawn uniformly). Publishes are
    uniform over the topic space, as when every device reports every metric
    at the same rate: no topic is hot, so per-topic caches do not flatter anyone.

``fanout``
    Topics of FANOUT_LEVELS levels, FANOUT_VOCAB words per level. Each filter
    level is a word (60%) or ``+`` (40%); 5% of filters end in ``#`` after
    their first two levels. A publish matches ~4.6% of the subscriptions:
    ~460 at 10k, ~4.6k at 100k, ~46k at 1M, spread over FANOUT_SUBSCRIBERS
    subscribers (so up to that many deliveries per publish).

The compiler's (ranked)
-----------------------
Two profiles, both deterministic for a given (n, seed):

``fanout`` (AMQP)
    The shape of Erlang Solutions' RabbitMQ topic-exchange study: every level
    of a binding key is a word with probability 0.70, '*' with 0.20 and '#'
    with 0.10.  Binding keys have 3-7 levels, routing keys 3-7 words, every
    word drawn from a vocabulary of RANKED_FANOUT_VOCAB words per level.  Wildcards
    are dense, so a publish matches a fixed fraction of all subscriptions:
    thousands of matches per topic at 1M subscriptions.  Subscribers (queues)
    hold ~100 subscriptions each at 1M (RANKED_FANOUT_SUBS_PER_SUBSCRIBER).

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

import functools
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SIZES = {"10k": 10_000, "100k": 100_000, "1m": 1_000_000}

METRICS = ("temp", "humidity", "pressure", "power", "voltage", "current", "rpm", "status")
SITE_DEVICES = 25
SUBS_PER_SITE = 50
DEVICE_SUBSCRIBERS = 1000
DEVICE_MIX = (("exact", 0.60), ("device+", 0.85), ("site+metric", 0.95), ("site#", 1.0))
CATCH_ALLS = ("#", "+/#", "+/+/+", "+/+/#")

FANOUT_LEVELS = 4
FANOUT_VOCAB = 10
FANOUT_WORD_P = 0.6
FANOUT_HASH_P = 0.05
FANOUT_SUBSCRIBERS = 1000

#: The exchange (MQTT dialect) the benchmark's subscriptions and publishes use.
EXCHANGE = "mqtt"


def device_filter(r: float, mix: tuple[tuple[str, float], ...], site: str,
                  device: Callable[[], str], metric: Callable[[], str]) -> str:
    """A ``devices`` filter by where ``r`` falls in ``mix``'s cumulative shares: exact, every
    metric of a device, one metric across a site, or a whole site. ``device`` and
    ``metric`` are called only for the levels the filter names (the draws stay those
    each generator made before this helper)."""
    if r < mix[0][1]:
        return f"{site}/{device()}/{metric()}"
    if r < mix[1][1]:
        return f"{site}/{device()}/+"
    if r < mix[2][1]:
        return f"{site}/+/{metric()}"
    return f"{site}/#"


@dataclass(frozen=True)
class Workload:
    profile: str
    n: int
    seed: int
    subs: list[tuple[str, str, str]]  # (subscription id, subscriber, MQTT filter)
    publishes: list[str]  # MQTT topic names, in publish order
    description: str

    @property
    def subscribers(self) -> list[str]:
        return sorted({s for _, s, _ in self.subs})


def devices(n: int, seed: int, publishes: int) -> Workload:
    rng = random.Random(f"e2e/devices/{n}/{seed}")
    sites = max(1, round(n / SUBS_PER_SITE))
    subscribers = [f"app{i:04d}" for i in range(DEVICE_SUBSCRIBERS)]
    rand, randrange, choice = rng.random, rng.randrange, rng.choice
    subs: list[tuple[str, str, str]] = []
    for i, filt in enumerate(CATCH_ALLS):
        subs.append((f"c{i}", subscribers[i * 7], filt))
    for i in range(n - len(CATCH_ALLS)):
        r = rand()
        s, d, m = randrange(sites), randrange(SITE_DEVICES), choice(METRICS)
        filt = device_filter(r, DEVICE_MIX, f"site{s}", functools.partial("dev{}".format, d), functools.partial(str, m))
        subs.append((f"d{i}", choice(subscribers), filt))
    prng = random.Random(f"e2e/devices/{n}/{seed}/publishes")
    pubs = [f"site{prng.randrange(sites)}/dev{prng.randrange(SITE_DEVICES)}/{prng.choice(METRICS)}"
            for _ in range(publishes)]
    return Workload(
        "devices", n, seed, subs, pubs,
        f"MQTT site/dev/metric: {sites} sites x {SITE_DEVICES} devices x {len(METRICS)} metrics; "
        f"filters 60% exact, 25% site/dev/+, 10% site/+/metric, 5% site/#, "
        f"{len(CATCH_ALLS)} catch-alls; {DEVICE_SUBSCRIBERS} subscribers; publishes uniform "
        f"over the {sites * SITE_DEVICES * len(METRICS)} topics",
    )


def fanout(n: int, seed: int, publishes: int) -> Workload:
    rng = random.Random(f"e2e/fanout/{n}/{seed}")
    subscribers = [f"q{i:04d}" for i in range(FANOUT_SUBSCRIBERS)]
    rand, randrange, choice = rng.random, rng.randrange, rng.choice
    subs = []
    for i in range(n):
        levels = []
        for lvl in range(FANOUT_LEVELS):
            if lvl == 2 and rand() < FANOUT_HASH_P:
                levels.append("#")
                break
            levels.append(f"w{lvl}{randrange(FANOUT_VOCAB)}" if rand() < FANOUT_WORD_P else "+")
        subs.append((f"f{i}", choice(subscribers), "/".join(levels)))
    prng = random.Random(f"e2e/fanout/{n}/{seed}/publishes")
    pubs = ["/".join(f"w{lvl}{prng.randrange(FANOUT_VOCAB)}" for lvl in range(FANOUT_LEVELS))
            for _ in range(publishes)]
    return Workload(
        "fanout", n, seed, subs, pubs,
        f"MQTT {FANOUT_LEVELS} levels x {FANOUT_VOCAB} words; filter levels "
        f"{FANOUT_WORD_P:.0%} word / {1 - FANOUT_WORD_P:.0%} '+', {FANOUT_HASH_P:.0%} end in '#'; "
        f"{FANOUT_SUBSCRIBERS} subscribers",
    )


PROFILES = {"devices": devices, "fanout": fanout}


def generate(profile: str, n: int, seed: int, publishes: int) -> Workload:
    return PROFILES[profile](n, seed, publishes)


def amqp_binding(mqtt_filter: str) -> str:
    """The RabbitMQ topic-exchange binding key of an MQTT filter."""
    return ".".join("*" if lvl == "+" else lvl for lvl in mqtt_filter.split("/"))


def amqp_routing_key(mqtt_topic: str) -> str:
    return mqtt_topic.replace("/", ".")


def changelog_value(exchange: str, subscriber: str, mqtt_filter: str) -> bytes:
    """The subscription changelog value (schemas.records.SUBSCRIPTION_FIELDS)."""
    return json.dumps({"exchange": exchange, "subscriber": subscriber, "filter": mqtt_filter},
                      separators=(",", ":")).encode()


def match_stats(w: Workload, sample: int = 2000) -> tuple[float, float]:
    """(mean matched subscriptions, mean distinct subscribers) per publish, on the
    first ``sample`` publishes, with a plain MQTT trie (no '$' topics here)."""
    root: dict = {}
    for _, sub, filt in w.subs:
        node = root
        for lvl in filt.split("/"):
            node = node.setdefault(lvl, {})
        node.setdefault(None, []).append(sub)

    def walk(node: dict, levels: list[str], i: int, out: list[str]) -> None:
        if "#" in node:
            out.extend(node["#"].get(None, ()))
        if i == len(levels):
            out.extend(node.get(None, ()))
            return
        for key in (levels[i], "+"):
            child = node.get(key)
            if child is not None:
                walk(child, levels, i + 1, out)

    subs = subscribers = 0
    topics = w.publishes[:sample]
    for t in topics:
        out: list[str] = []
        walk(root, t.split("/"), 0, out)
        subs += len(out)
        subscribers += len(set(out))
    return subs / len(topics), subscribers / len(topics)


def write_files(w: Workload, folder: Path) -> dict[str, Path]:
    """The text files the C clients read: ``subs.tsv`` (subscriber TAB filter) and
    ``publishes.txt`` (one topic a line), MQTT form; the clients translate for AMQP."""
    folder.mkdir(parents=True, exist_ok=True)
    subs_path, pubs_path = folder / "subs.tsv", folder / "publishes.txt"
    with subs_path.open("w") as f:
        f.writelines(f"{sub}\t{filt}\n" for _, sub, filt in w.subs)
    with pubs_path.open("w") as f:
        f.writelines(f"{t}\n" for t in w.publishes)
    return {"subs": subs_path, "publishes": pubs_path}


# --- the compiler's ranked workloads --------------------------------------------------

ZIPF_S = 1.0

RANKED_FANOUT_VOCAB = 8
RANKED_FANOUT_FILTER_LEVELS = (3, 7)
RANKED_FANOUT_TOPIC_LEVELS = (3, 7)
RANKED_FANOUT_TOPIC_SPACE = 200_000
RANKED_FANOUT_SUBS_PER_SUBSCRIBER = 100
RANKED_FANOUT_MIN_SUBSCRIBERS = 1000

DEVICES_PER_SITE = 250
RANKED_DEVICE_MIX = (  # (kind, cumulative probability)
    ("exact", 0.9145),
    ("device+", 0.9945),
    ("site+metric", 0.9995),
    ("site#", 1.0),
)


@dataclass
class RankedWorkload:
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


def ranked_fanout(n: int, seed: int) -> RankedWorkload:
    rng = random.Random(f"fanout/{n}/{seed}")
    levels = max(RANKED_FANOUT_TOPIC_LEVELS[1], RANKED_FANOUT_FILTER_LEVELS[1])
    vocab = [[f"w{lvl}{i}" for i in range(RANKED_FANOUT_VOCAB)] for lvl in range(levels)]
    subscribers = max(RANKED_FANOUT_MIN_SUBSCRIBERS, n // RANKED_FANOUT_SUBS_PER_SUBSCRIBER)
    subscribers = min(subscribers, n)
    lo, hi = RANKED_FANOUT_FILTER_LEVELS
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
    tlo, thi = RANKED_FANOUT_TOPIC_LEVELS
    space_size = sum(RANKED_FANOUT_VOCAB**k for k in range(tlo, thi + 1))
    target = min(RANKED_FANOUT_TOPIC_SPACE, space_size)
    seen: set[str] = set()
    space: list[str] = []
    while len(space) < target:
        t = ".".join(choice(vocab[lvl]) for lvl in range(randint(tlo, thi)))
        if t not in seen:
            seen.add(t)
            space.append(t)
    return RankedWorkload(
        profile="fanout",
        dialect="amqp",
        exchange="events",
        subs=subs,
        topic_space=space,
        description=(
            f"AMQP; binding levels 70% word / 20% '*' / 10% '#', {lo}-{hi} levels, "
            f"{RANKED_FANOUT_VOCAB} words per level; routing keys {tlo}-{thi} words; "
            f"{subscribers} subscribers; {len(space)} topics, Zipf s={ZIPF_S}"
        ),
    )


def ranked_devices(n: int, seed: int) -> RankedWorkload:
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
        filt = device_filter(r, RANKED_DEVICE_MIX, s, lambda: choice(dev_names), lambda: choice(METRICS))
        subs.append((f"d{i}", f"app{randint(0, subscribers - 1)}", filt))
    return RankedWorkload(
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


RANKED_PROFILES = {"fanout": ranked_fanout, "devices": ranked_devices}
