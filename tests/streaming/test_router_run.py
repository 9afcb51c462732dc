"""``bitroute run`` as users start it: a process that routes, prints progress and stops on SIGTERM."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer

from streaming.config import Config

START_DEADLINE_S = 300.0
BATCH_DEADLINE_S = 300.0
STOP_DEADLINE_S = 120.0


class Lines:
    """The process's stdout, line by line, read on a thread so that waits have deadlines."""

    def __init__(self, process: subprocess.Popen) -> None:
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, args=(process,), daemon=True).start()

    def _pump(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def wait_for(self, predicate, deadline_s: float) -> str:
        deadline = time.monotonic() + deadline_s
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no such line within {deadline_s}s; seen: {self.seen[-20:]}"
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                continue
            assert line is not None, f"the process ended; seen: {self.seen[-20:]}"
            self.seen.append(line)
            if predicate(line):
                return line


def test_bitroute_run_routes_prints_progress_and_stops_cleanly_on_sigterm(
        base_config: Config, tmp_path: Path):
    tag = uuid.uuid4().hex[:10]
    settings = {
        "kafka.bootstrap": base_config.kafka.bootstrap,
        "kafka.publishes_topic": f"pub-{tag}",
        "kafka.subscriptions_topic": f"subs-{tag}",
        "kafka.rejected_topic": f"rej-{tag}",
        "kafka.deliveries_topic_prefix": f"dlv-{tag}.",
        "broker.embedded": "false",
        "delta.warehouse": str(tmp_path / "delta"),
        "streaming.checkpoint_dir": str(tmp_path / "checkpoints"),
        "streaming.trigger_interval": "200 milliseconds",
        "spark.master": "local[2]",
        "spark.shuffle_partitions": "2",
        "spark.log_level": "ERROR",
    }
    flags = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    stderr = (tmp_path / "stderr.log").open("w")
    process = subprocess.Popen([sys.executable, "-m", "streaming.cli", "run", *flags],
                               stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=tmp_path)
    try:
        lines = Lines(process)
        lines.wait_for(lambda line: "Ctrl-C stops after the current batch" in line,
                       START_DEADLINE_S)
        producer = Producer({"bootstrap.servers": base_config.kafka.bootstrap})
        producer.produce(settings["kafka.subscriptions_topic"], key=b"s1", value=json.dumps(
            {"exchange": "mqtt", "subscriber": "kim", "filter": "door/+"}).encode())
        producer.produce(settings["kafka.publishes_topic"], key=b"door/front", value=b"open",
                         headers=[("exchange", b"mqtt")])
        assert producer.flush(30) == 0
        progress = lines.wait_for(lambda line: line.startswith("batch "), BATCH_DEADLINE_S)
        assert "1 publishes, 1 deliveries, 0 rejected, snapshot v" in progress

        process.send_signal(signal.SIGTERM)
        assert process.wait(STOP_DEADLINE_S) == 0, (tmp_path / "stderr.log").read_text()[-3000:]
        lines.wait_for(lambda line: line == "bitroute: stopped", 10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(STOP_DEADLINE_S)
        stderr.close()
