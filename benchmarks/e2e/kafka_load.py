"""The Kafka side of the benchmark, with confluent-kafka: the subscription
changelog loader, the publish driver (separate processes) and the delivery
consumer that records publish-to-delivery latency.

Every publish carries PUBLISHED_HEADER, its publish time (CLOCK_REALTIME ns,
8 bytes big-endian), and the exchange header; the router copies a publish's
headers onto each delivery, so the consumer's latency is its receive time
minus that header.
"""

from __future__ import annotations

import multiprocessing as mp
import struct
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event

import numpy as np
from confluent_kafka import OFFSET_END, KafkaException, TopicPartition

from benchmarks.workload import Workload, changelog_value
from schemas.records import EXCHANGE_HEADER
from streaming import kafka
from streaming.kafka.settings import ClientSettings

PUBLISHED_HEADER = "bench.published_ns"
STOP_QUIET_S = 1.0
"""How long a stopped consumer still reads while deliveries arrive (:func:`stop_event`)."""
_PRODUCER = {
    "linger.ms": 20,
    "batch.size": 1_000_000,
    "compression.type": "lz4",
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "acks": "all",
}
_TS = struct.Struct(">q")


def load_changelog(bootstrap: str | ClientSettings, topic: str, w: Workload, exchange: str) -> tuple[float, float]:
    """Produce every subscription of ``w`` to the changelog, batched; wait for every ack.

    Returns (epoch seconds when the first record was handed to the client,
    epoch seconds when Kafka had acknowledged the last).
    """
    producer = kafka.producer(ClientSettings.coerce(bootstrap), _PRODUCER)
    failures: list[str] = []

    def acked(err, _msg) -> None:
        if err is not None:
            failures.append(str(err))

    started = time.time()
    for sid, sub, filt in w.subs:
        kafka.produce_when_room(producer, topic, changelog_value(exchange, sub, filt),
                                sid.encode(), on_delivery=acked)
        producer.poll(0)
    if producer.flush(300) != 0 or failures:
        raise RuntimeError(f"changelog load failed: {failures[:3]}")
    return started, time.time()


# --- publish driver ------------------------------------------------------------------

def _publisher(bootstrap: str | ClientSettings, topic: str, exchange: str, topics: list[str], rate: float,
               duration: float, start_at: float, payload: int, count: int, out: mp.Queue) -> None:
    producer = kafka.producer(ClientSettings.coerce(bootstrap), _PRODUCER)
    keys = [t.encode() for t in topics]
    body = b"x" * payload
    ex = exchange.encode()
    n, i, sent = len(keys), 0, 0
    time.sleep(max(0.0, start_at - time.time()))
    t0 = time.time()
    end = t0 + duration
    produce, poll = producer.produce, producer.poll
    while True:
        now = time.time()
        if now >= end or sent >= count:
            break
        target = int((now - t0) * rate) + 1 if rate > 0 else sent + 2000
        target = min(target, count)
        if sent >= target:
            time.sleep(0.0005)
            continue
        burst = min(target - sent, 2000)
        for _ in range(burst):
            ts = _TS.pack(time.time_ns())
            try:
                produce(topic, body, keys[i], headers=[(EXCHANGE_HEADER, ex), (PUBLISHED_HEADER, ts)])
            except BufferError:
                poll(0.01)
                continue
            sent += 1
            i += 1
            if i == n:
                i = 0
        poll(0)
    remaining = producer.flush(120)
    out.put({"sent": sent, "unacked": remaining, "seconds": time.time() - t0})


@dataclass
class PublishRun:
    sent: int
    seconds: float
    processes: list[BaseProcess]


def start_publishers(bootstrap: str | ClientSettings, topic: str, exchange: str, w: Workload, rate: float,
                     duration: float, processes: int = 2, payload: int = 64,
                     start_at: float | None = None,
                     count: int | None = None) -> tuple[list[BaseProcess], mp.Queue, float]:
    """``processes`` producer processes sharing ``rate`` publishes/s (0: as fast as they can)
    for ``duration`` seconds from the returned start time, or until ``count`` are sent."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    if start_at is None:
        start_at = time.time() + 2.5  # spawn + imports
    per_process = (count + processes - 1) // processes if count else 1 << 62
    procs: list[BaseProcess] = []
    for k in range(processes):
        topics = w.publishes[k::processes]
        p = ctx.Process(target=_publisher, args=(bootstrap, topic, exchange, topics,
                                                 rate / processes, duration, start_at, payload,
                                                 per_process, out),
                        daemon=True)
        p.start()
        procs.append(p)
    return procs, out, start_at


def join_publishers(procs: list[BaseProcess], out: mp.Queue, timeout: float) -> dict:
    results = [out.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    return {"sent": sum(r["sent"] for r in results),
            "unacked": sum(r["unacked"] for r in results),
            "seconds": max(r["seconds"] for r in results)}


# --- delivery consumer --------------------------------------------------------------

def _consumer(bootstrap: str | ClientSettings, topics: list[str], partitions: int, window: tuple[float, float],
              deadline: float, idle: float, ready: Event, out: mp.Queue,
              idle_after_first: bool = False, stop: Event | None = None) -> None:
    consumer = kafka.consumer(ClientSettings.coerce(bootstrap), f"bench-{time.time_ns()}", {
        "fetch.min.bytes": 1, "fetch.wait.max.ms": 20, "queued.max.messages.kbytes": 262_144})
    # Start at the end of every delivery topic: only this run's deliveries count.
    consumer.assign([TopicPartition(t, p, OFFSET_END) for t in topics for p in range(partitions)])
    for _ in range(20):  # let the assignment resolve its end offsets
        consumer.poll(0.05)
    ready.set()
    w0, w1 = window
    lat: list[np.ndarray] = []
    buf = np.empty(200_000, dtype=np.int64)
    nb = 0
    received = in_window = 0
    last = time.time()
    first_arrival = last_arrival = 0.0
    header = PUBLISHED_HEADER
    w0_ns, w1_ns = int(w0 * 1e9), int(w1 * 1e9)
    unpack = _TS.unpack
    per_second: dict[int, int] = {}  # arrivals by the Unix second they arrived in
    while True:
        msgs = consumer.consume(10_000, 0.2)
        now_ns = time.time_ns()
        now = now_ns / 1e9
        if msgs:
            last = now
            for m in msgs:
                if m.error() is not None:
                    continue
                received += 1
                hs = m.headers()
                if hs is None:
                    continue
                for k, v in hs:
                    if k == header:
                        sent = unpack(v)[0]
                        if w0_ns <= sent < w1_ns:
                            buf[nb] = now_ns - sent
                            nb += 1
                            if nb == len(buf):
                                lat.append(buf.copy())
                                nb = 0
                        break
            if w0 <= now < w1:
                in_window += len(msgs)
            second = int(now)
            per_second[second] = per_second.get(second, 0) + len(msgs)
            if not first_arrival:
                first_arrival = now
            last_arrival = now
        if now > deadline or (now > w1 and now - last > idle
                              and (first_arrival or not idle_after_first)):
            break
        if stop is not None and now - last > STOP_QUIET_S and stop.is_set():
            break
    consumer.close()
    lat.append(buf[:nb].copy())
    out.put({"received": received, "window_arrivals": in_window,
             "latencies_ns": np.concatenate(lat), "first_arrival": first_arrival,
             "last_arrival": last_arrival, "per_second": per_second})


def start_consumers(bootstrap: str | ClientSettings, topics: list[str], partitions: int,
                    window: tuple[float, float], deadline: float, processes: int = 1,
                    idle: float = 5.0, idle_after_first: bool = False,
                    stop: Event | None = None):
    """``processes`` delivery consumers from the end of ``topics``; each stops at ``deadline``,
    once ``idle`` seconds passed without a delivery after the window's end (with
    ``idle_after_first``, only once a first delivery arrived), or once ``stop``
    (:func:`stop_event`) is set and :data:`STOP_QUIET_S` passed without a delivery."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs, events = [], []
    for k in range(processes):
        ready = ctx.Event()
        p = ctx.Process(target=_consumer, args=(bootstrap, topics[k::processes], partitions,
                                                window, deadline, idle, ready, out,
                                                idle_after_first, stop), daemon=True)
        p.start()
        procs.append(p)
        events.append(ready)
    for e in events:
        if not e.wait(120):
            raise RuntimeError("delivery consumer not ready")
    return procs, out


def stop_event() -> Event:
    """An event :func:`start_consumers` takes as ``stop``: set it once the router reported
    every publish routed (its deliveries acknowledged), and the consumers end."""
    return mp.get_context("spawn").Event()


def join_consumers(procs, out, timeout: float) -> dict:
    results = [out.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    lat = np.concatenate([r["latencies_ns"] for r in results]) / 1e6
    per_second: dict[int, int] = {}
    for r in results:
        for second, n in r["per_second"].items():
            per_second[second] = per_second.get(second, 0) + n
    return {
        "per_second": per_second,
        "received": sum(r["received"] for r in results),
        "window_arrivals": sum(r["window_arrivals"] for r in results),
        "latency_n": int(lat.size),
        "p50_ms": float(np.percentile(lat, 50)) if lat.size else float("nan"),
        "p99_ms": float(np.percentile(lat, 99)) if lat.size else float("nan"),
        "max_ms": float(lat.max()) if lat.size else float("nan"),
        "first_arrival": min((r["first_arrival"] for r in results if r["first_arrival"]), default=0.0),
        "last_arrival": max(r["last_arrival"] for r in results),
    }


def end_offsets(bootstrap: str | ClientSettings, topic: str) -> int:
    """Sum of the end offsets of ``topic``'s partitions."""
    c = kafka.consumer(ClientSettings.coerce(bootstrap), "bench-offsets")
    try:
        md = c.list_topics(topic, timeout=30)
        total = 0
        for p in md.topics[topic].partitions:
            _, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            total += high
        return total
    except KafkaException:
        raise
    finally:
        c.close()
