"""The Kafka Streams side of the benchmark (issue 22): the router a Kafka shop would
write instead of bitroute (``benchmarks/e2e/kstreams/``, built by ``setup.sh``), on
an embedded Kafka broker of its own, with bitroute's topics, changelog, load driver
and delivery consumer (:mod:`benchmarks.e2e.bitroute_run`, :mod:`benchmarks.e2e.kafka_load`).

The application reads the subscription changelog to its end before its topology
starts (``open_s``), then routes each publish to ``kafka.deliveries_topic_prefix +
subscriber`` with bitroute's delivery headers, the publish's own included (so the
consumer's latency works unchanged). It prints a ``PROBE`` line every second
(publishes processed, deliveries Kafka acknowledged), which stands in for
bitroute's per-batch reports:

1. warm-up: a paced trickle (the JIT, the producers' metadata of 1,000 topics).
2. saturation: a backlog produced as fast as the driver can; sustained rate =
   publishes processed (deliveries acknowledged) per second of wall time between
   the seconds at which 5% and 95% of the backlog had been processed, every
   second in between counted (:func:`benchmarks.e2e.drain.drain_rates`).
3. latency at 50% and 90% of that rate, exactly as for bitroute.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.e2e import bitroute_run
from benchmarks.e2e.bitroute_run import Env, Phase
from benchmarks.e2e.drain import drain_rates
from benchmarks.harness import ReportedProcess
from benchmarks.workload import Workload

PROJECT = Path(__file__).resolve().parent / "kstreams"
JAR = PROJECT / "target" / "kstreams-peer.jar"
LIB = PROJECT / "target" / "lib"
MAIN = "bitroute.bench.kstreams.Main"
JVM_OPTIONS = ("-Xms256m", "-Xmx1g")
#: The peer writes one topic per subscriber whatever the router's settings say.
LAYOUT = "kafka.delivery_layout=topic-per-subscriber"


class KStreamsProcess(ReportedProcess):
    """The Kafka Streams JVM: ``STARTED {json}`` once it runs, ``PROBE {json}`` each second
    (``rows``, ``deliveries``, ``end``) on its stdout."""

    def parse_stdout(self, line: str) -> None:
        if line.startswith("PROBE "):
            self.batches.append(json.loads(line[6:]))
        elif line.startswith("STARTED "):
            self.started = json.loads(line[8:])
            self._events.put("started")


def command(env: Env, stream_sets: list[str]) -> list[str]:
    """The ``java`` command line of the peer on ``env``'s broker and topics."""
    if not JAR.exists():
        raise RuntimeError(f"{JAR} is missing: run benchmarks/e2e/setup.sh")
    k, ex = env.config.kafka, env.config.exchanges
    if env.broker is None:
        raise RuntimeError("the Kafka Streams peer runs on a broker of its own: start_broker() first")
    argv = ["java", *JVM_OPTIONS, "-cp", f"{JAR}:{LIB}/*", MAIN,
            "--bootstrap", env.broker.bootstrap, "--state-dir", str(env.folder / "streams-state"),
            "--publishes-topic", k.publishes_topic, "--subscriptions-topic", k.subscriptions_topic,
            "--deliveries-prefix", k.deliveries_topic_prefix,
            "--delivery-partitions", str(k.delivery_partitions),
            "--default-exchange", ex.default]
    for name, dialect in ex.dialects.items():
        argv += ["--exchange", f"{name}={dialect}"]
    for s in stream_sets:
        argv += ["--set", s]
    return argv


@dataclass
class KStreamsEnv(Env):
    """A broker and the Kafka Streams peer on loopback, in ``folder``."""

    stream_sets: list[str] = field(default_factory=list)

    def start_router(self) -> dict:
        self._router = KStreamsProcess(command(self, self.stream_sets),
                                       self.folder / "kstreams.log").start()
        return self._router.wait_started()

    def roles(self) -> dict:
        r = self.router
        return {
            "kstreams: JVM": lambda: r.pids()["jvm"],
            "Kafka broker": lambda: [pid] if self.broker is not None and (pid := self.broker.pid()) else [],
        }


@dataclass
class KStreamsResult:
    changelog_write_s: float
    open_s: float
    saturation: Phase
    at50: Phase
    at90: Phase
    stream_sets: list[str] = field(default_factory=list)


def run(folder: Path, w: Workload, user_sets: list[str], stream_sets: list[str], backlog: int,
        warmup: float, measure: float, publishers: int, consumers: int, log) -> KStreamsResult:
    env = KStreamsEnv(folder, [*user_sets, LAYOUT], name="kstreams", stream_sets=stream_sets)
    try:
        write_s, started = env.bring_up(w, log)
        phases = bitroute_run.measure_phases(env, w, backlog, warmup, measure, publishers,
                                             consumers, log, drain_rates)
        return KStreamsResult(write_s, started["open_s"], *phases, stream_sets)
    finally:
        env.stop()
