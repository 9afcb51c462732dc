"""RabbitMQ and Mosquitto runs: the same subscriptions and publishes as bitroute,
driven by the compiled C clients (build/amqp_bench, build/mqtt_bench).

Each system gets one run at full speed (the publisher as fast as the broker
takes it) and two paced runs at 50% and 90% of the sustained publish rate for
latency. A run is: the consumer connects and subscribes (READY), we hand it
the measurement window, the publisher runs ``warmup + measure`` seconds, and
the figures count what happened in the window (publishes by publish time,
deliveries by arrival time, latency of the messages published in the window).
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.e2e import procstat
from benchmarks.e2e.brokers import Mosquitto, RabbitMQ

BUILD = Path(__file__).resolve().parent / "build"
READY_TIMEOUT_S = 600.0
DRAIN_S = 20.0  # how long a consumer may go on draining after the window


@dataclass
class RunResult:
    rate: float  # the publisher's target (0: as fast as possible)
    publishes_per_s: float
    deliveries_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    published: int
    received: int
    cores: dict[str, float] = field(default_factory=dict)
    max_core: dict[str, float] = field(default_factory=dict)
    peak_rss: dict[str, int] = field(default_factory=dict)

    def lag_grows(self, per_publish: float, tolerance: float = 0.03) -> bool:
        """Deliveries arrived slower than they were produced in the window."""
        return self.deliveries_per_s < (1 - tolerance) * self.publishes_per_s * per_publish


def _wait_ready(proc: subprocess.Popen, timeout: float) -> None:
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError(f"consumer exited before READY (status {proc.wait()})")
        if line.strip() == b"READY":
            return
    raise RuntimeError("consumer not READY in time")


def run_once(binary: str, port: int, files: dict[str, Path], rate: float, warmup: float,
             measure: float, consumer_args: list[str], roles: dict,
             payload: int = 64) -> RunResult:
    exe = str(BUILD / binary)
    if binary == "amqp_bench":
        # Queues keep what a full-speed run could not deliver: start empty.
        subprocess.run([exe, "purge", "--port", str(port), "--subs", str(files["subs"])],
                       capture_output=True, check=True, timeout=300)
    pub: subprocess.Popen | None = None
    consumer = subprocess.Popen([exe, "consume", "--port", str(port), "--subs", str(files["subs"]),
                                 *consumer_args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    try:
        _wait_ready(consumer, READY_TIMEOUT_S)
        start = time.time() + 0.5
        w0, w1 = start + warmup, start + warmup + measure
        assert consumer.stdin is not None
        consumer.stdin.write(f"{w0:.6f} {w1:.6f} {w1 + DRAIN_S:.6f}\n".encode())
        consumer.stdin.flush()
        time.sleep(max(0.0, start - time.time()))
        sampler = procstat.Sampler({**roles, "client: consumer": lambda: [consumer.pid]})
        pub = subprocess.Popen([exe, "publish", "--port", str(port), "--topics",
                                str(files["publishes"]), "--rate", str(rate), "--duration",
                                str(warmup + measure + 0.5), "--window-start", f"{w0:.6f}",
                                "--window-end", f"{w1:.6f}", "--payload", str(payload)],
                               stdout=subprocess.PIPE)
        sampler.roles["client: publisher"] = lambda: [pub.pid]
        sampler.stats["client: publisher"] = procstat.RoleStats()
        # Sample only the measurement window.
        time.sleep(max(0.0, w0 - time.time()))
        sampler.start()
        time.sleep(max(0.0, w1 - time.time()))
        sampler.stop()
        try:
            pub_out, _ = pub.communicate(timeout=60 + warmup + measure)
        except subprocess.TimeoutExpired:
            # A broker that blocks its publishers (RabbitMQ's memory alarm on a
            # large fan-out) can hold a publish call for minutes: the window's
            # arrivals still tell the delivery rate.
            pub.kill()
            pub.wait()
            pub_out = None
        cons_out, _ = consumer.communicate(timeout=DRAIN_S + 60)
    finally:
        for p in (consumer, pub):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    c = json.loads(cons_out.decode().strip().splitlines()[-1])
    if pub_out is None:
        published, publishes_per_s = -1, math.nan
    else:
        p = json.loads(pub_out.decode().strip().splitlines()[-1])
        published = p["published"]
        # By publish time in the window; a publisher blocked by back-pressure for the
        # whole window publishes nothing in it: then its overall rate.
        publishes_per_s = (p["window_published"] / p["window_s"] if p["window_published"]
                           else p["published"] / p["elapsed_s"])
    return RunResult(
        rate=rate,
        publishes_per_s=publishes_per_s,
        deliveries_per_s=c["window_arrivals"] / c["window_s"],
        p50_ms=c["p50_ms"], p99_ms=c["p99_ms"], max_ms=c["max_ms"],
        published=published, received=c["received"],
        cores={k: sampler.cores(k) for k in sampler.stats},
        max_core={k: v.max_core for k, v in sampler.stats.items()},
        peak_rss={k: v.peak_rss for k, v in sampler.stats.items()},
    )


@dataclass
class SystemResult:
    name: str
    full: RunResult
    at50: RunResult
    at90: RunResult
    sustained_publishes: float
    sustained_deliveries: float
    setup_s: float
    notes: list[str] = field(default_factory=list)


def _sustained(full: RunResult, per_publish: float) -> tuple[float, float]:
    """Publishes/s and deliveries/s that the consumers kept up with (the
    arrivals alone when the publisher's own count was lost, see :func:`run_once`)."""
    deliveries = full.deliveries_per_s
    if not math.isnan(full.publishes_per_s):
        deliveries = min(deliveries, full.publishes_per_s * per_publish)
    return deliveries / per_publish, deliveries


def _measure(name: str, binary: str, port: int, files: dict[str, Path], per_publish: float,
             warmup: float, measure: float, consumer_args: list[str], roles: dict,
             setup_s: float, log) -> SystemResult:
    full = run_once(binary, port, files, 0, warmup, measure, consumer_args, roles)
    pubs, dels = _sustained(full, per_publish)
    log(f"{name}: full speed {full.publishes_per_s:,.0f} publishes/s, "
        f"{full.deliveries_per_s:,.0f} deliveries/s (sustained {pubs:,.0f}/{dels:,.0f}); "
        f"cores {_fmt_cores(full)}")
    at50 = run_once(binary, port, files, 0.5 * pubs, warmup, measure, consumer_args, roles)
    log(f"{name}: 50% -> p50 {at50.p50_ms:.2f} ms p99 {at50.p99_ms:.2f} ms")
    at90 = run_once(binary, port, files, 0.9 * pubs, warmup, measure, consumer_args, roles)
    log(f"{name}: 90% -> p50 {at90.p50_ms:.2f} ms p99 {at90.p99_ms:.2f} ms")
    return SystemResult(name, full, at50, at90, pubs, dels, setup_s)


def _fmt_cores(r: RunResult) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in r.cores.items())


def rabbitmq(folder: Path, files: dict[str, Path], per_publish: float, warmup: float,
             measure: float, threads: int, log) -> SystemResult:
    broker = RabbitMQ(folder)
    t0 = time.monotonic()
    broker.start()
    try:
        log(f"rabbitmq: up on 127.0.0.1:{broker.port} after {time.monotonic() - t0:.1f}s")
        out = subprocess.run([str(BUILD / "amqp_bench"), "setup", "--port", str(broker.port),
                              "--subs", str(files["subs"])], capture_output=True, check=True,
                             timeout=1800)
        setup = json.loads(out.stdout.decode().strip().splitlines()[-1])
        log(f"rabbitmq: {setup['queues']} queues, {setup['bindings']:,} bindings in "
            f"{setup['bind_s']:.1f}s")
        return _measure("rabbitmq", "amqp_bench", broker.port, files, per_publish, warmup,
                        measure, ["--threads", str(threads)], {"broker": broker.pids},
                        setup["bind_s"], log)
    finally:
        broker.stop()


def mosquitto(folder: Path, files: dict[str, Path], per_publish: float, warmup: float,
              measure: float, clients: int, log) -> SystemResult:
    broker = Mosquitto(folder).start()
    try:
        log(f"mosquitto: up on 127.0.0.1:{broker.port}")
        return _measure("mosquitto", "mqtt_bench", broker.port, files, per_publish, warmup,
                        measure, ["--clients", str(clients)], {"broker": broker.pids}, 0.0, log)
    finally:
        broker.stop()
