"""confluent-kafka against kafka-python on the same produce (docs/architecture.md, "One
Python Kafka client"): N records of 64 bytes with the delivery contract's five headers,
acks=all, to one embedded broker, the two clients alternating for R rounds after a
warm-up round. Prints records/s and CPU us per record (this process: librdkafka's
threads included) per round, then the medians and ranges.

kafka-python is not a dependency of bitroute; install it aside for this run:

    pip install --target /tmp/kp kafka-python==3.0.12
    PYTHONPATH=/tmp/kp taskset -c 1 .venv/bin/python -m benchmarks.kafka_clients 50000 3
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import confluent_kafka
import kafka

from streaming.kafka.broker import EmbeddedBroker, free_port

N = int(sys.argv[1]) if len(sys.argv) > 1 else 50000
R = int(sys.argv[2]) if len(sys.argv) > 2 else 3
HEADERS = [("exchange", b"mqtt"), ("bitroute.message_id", b"bitroute.publishes/0/123456"),
           ("bitroute.subscription_ids", b'["s-000123"]'), ("bitroute.snapshot_version", b"42"),
           ("unit", b"celsius")]
VALUE = b"x" * 64

def confluent(bootstrap, topic):
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                  "enable.idempotence": True, "linger.ms": 5})
    acked = [0]
    def cb(err, msg):
        if err is None: acked[0] += 1
    for _ in range(N):
        while True:
            try:
                p.produce(topic, key=b"sensors/a/b", value=VALUE, headers=HEADERS, on_delivery=cb); break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    p.flush(120)
    return acked[0]

def kafkapython(bootstrap, topic):
    p = kafka.KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    acked = [0]
    def ok(_): acked[0] += 1
    for _ in range(N):
        p.send(topic, key=b"sensors/a/b", value=VALUE, headers=HEADERS).add_callback(ok)
    p.flush(120); p.close()
    return acked[0]

with tempfile.TemporaryDirectory() as d:
    b = EmbeddedBroker(Path(d), port=free_port(), controller_port=free_port()); b.start()
    try:
        res = {"confluent-kafka": [], "kafka-python": []}
        for r in range(R + 1):
            for name, fn in (("confluent-kafka", confluent), ("kafka-python", kafkapython)):
                topic = f"t-{name}-{r}"
                w, c = time.perf_counter(), time.process_time()
                acked = fn(b.bootstrap, topic)
                w, c = time.perf_counter() - w, time.process_time() - c
                assert acked == N, (name, acked)
                if r:  # round 0 warms up
                    res[name].append((N / w, c / N * 1e6))
                    print(json.dumps({"client": name, "round": r, "records_per_s": round(N / w), "cpu_us_per_record": round(c / N * 1e6, 1)}), flush=True)
        for name, xs in res.items():
            rates = [x[0] for x in xs]; cpus = [x[1] for x in xs]
            print(f"{name}: median {statistics.median(rates):,.0f} records/s (range {min(rates):,.0f}-{max(rates):,.0f}), "
                  f"median {statistics.median(cpus):.1f} us CPU per record (range {min(cpus):.1f}-{max(cpus):.1f})")
    finally:
        b.stop()
