"""Workloads of the end-to-end benchmark: the same subscriptions and publishes for
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
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

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
        if r < DEVICE_MIX[0][1]:
            filt = f"site{s}/dev{d}/{m}"
        elif r < DEVICE_MIX[1][1]:
            filt = f"site{s}/dev{d}/+"
        elif r < DEVICE_MIX[2][1]:
            filt = f"site{s}/+/{m}"
        else:
            filt = f"site{s}/#"
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
