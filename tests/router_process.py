"""``bitroute run`` as a child process of a test: its own SparkSession and JVM, its
stdout lines collected as they come, stopped as users stop it (SIGTERM, SIGINT) or
killed with everything it started.

conftest.py's ``router_process`` fixture starts one and kills it at the end of the test
if the test did not stop it; fixtures of a wider scope use :class:`RouterProcess`
directly and stop it themselves. Its JVMs run with ``short_jvm.SHORT_JVM`` (a router
of a test lives seconds to minutes; its start is most of its cost).
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from contextlib import suppress
from pathlib import Path
from typing import IO

from confluent_kafka import Producer

from schemas.records import EXCHANGE_HEADER, message_id
from short_jvm import short_jvm_env
from streaming.config import Config
from streaming.kafka.clients import record_position
from waiting import wait_until

DEADLINE_S = 600.0
BATCH_LINE = re.compile(r"^batch (\d+): (\d+) publishes, (\d+) deliveries")


class RouterProcess:
    """A `bitroute run` child process whose stdout lines are collected as they come."""

    def __init__(self, settings: dict[str, str], log: Path, cwd: Path | None = None,
                 command: list[str] | None = None, env: dict[str, str] | None = None) -> None:
        """``command`` (default: this Python's ``bitroute run``) gets ``settings`` as
        ``--set`` flags after it; ``env`` (default: this process's) gets
        ``JAVA_TOOL_OPTIONS`` with ``short_jvm.SHORT_JVM``."""
        flags = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
        env = short_jvm_env(os.environ if env is None else env)
        self._log = log.open("a")
        self.process = subprocess.Popen(
            [*(command or [sys.executable, "-m", "streaming.cli.main", "run"]), *flags],
            stdout=subprocess.PIPE, stderr=self._log, text=True, start_new_session=True, cwd=cwd,
            env=env,
        )
        assert self.process.stdout is not None  # a PIPE
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
            self._log.write(line)
            self._log.flush()
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, pattern: re.Pattern[str], timeout: float = DEADLINE_S) -> re.Match[str]:
        """Wait for a stdout line matching ``pattern``; fail if the process exits first."""
        def next_match() -> re.Match[str] | None:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                assert self.process.poll() is None, f"bitroute run exited: {self.seen[-5:]}"
                return None
            self.seen.append(line)
            return pattern.search(line)

        return wait_until(next_match, f"a line matching {pattern.pattern!r} "
                          f"(the last lines: {self.seen[-5:]})", timeout)

    def kill(self) -> None:
        """SIGKILL the router and everything it started (its Spark JVM and Python workers)."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=60)

    def terminate(self, signum: int = signal.SIGTERM, timeout: float = 180.0) -> int:
        """SIGTERM (or SIGINT, as Ctrl-C sends): the router stops after the current
        batch; return its exit status. The lines printed until the exit are
        appended to :attr:`seen`.
        """
        self.process.send_signal(signum)
        try:
            return self.process.wait(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.kill()
            self._drain()

    def _drain(self) -> None:
        """Move the lines printed until the exit to :attr:`seen` (the reader thread
        queues them until stdout closes; give up after 10 s)."""
        def drained() -> bool:
            try:
                self.seen.append(self.lines.get(timeout=0.5))
                return False
            except queue.Empty:
                return (self.process.stdout is None or self.process.stdout.closed
                        or self.process.poll() is not None)

        with suppress(AssertionError):
            wait_until(drained, "the router's last lines", timeout=10)


def publish_keys(config: Config, keys: list[tuple[str, str]]) -> list[str]:
    """Produce (exchange, routing key) publishes in one batch; return their message ids.

    The ids come back in the order of ``keys`` (acknowledgements arrive per
    partition, not in that order).
    """
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap, "linger.ms": 5})
    ids: list[str | None] = [None] * len(keys)

    def acked_as(position: int):
        def acked(err, record) -> None:
            assert err is None, err
            ids[position] = message_id(*record_position(record))
        return acked

    for position, (exchange, key) in enumerate(keys):
        producer.produce(config.kafka.publishes_topic, key=key.encode(), value=b"x",
                         headers=[(EXCHANGE_HEADER, exchange.encode())],
                         on_delivery=acked_as(position))
    assert producer.flush(60) == 0
    sent = [i for i in ids if i is not None]
    assert len(sent) == len(ids), "a publish without its acknowledgement"
    return sent
