"""The embedded Kafka broker: a real Apache Kafka 4 broker for local runs and tests.

One JVM process in KRaft mode, a single node acting as broker and controller,
listening on loopback only, its data and log in one folder. The jars come from
Maven Central through :mod:`streaming.jvm` (no Docker, no tarball).

State lives in the data folder: ``server.properties`` (rewritten at each
start), ``logs/`` (the formatted KRaft storage), ``broker.pid`` and
``broker.log``. ``start`` is idempotent: a broker already running from the
same folder is reused. The process is detached, so it outlives the command
that started it; ``stop`` ends it (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException

import conf
from streaming import jvm, kafka
from streaming.config import BrokerConfig
from streaming.kafka.errors import BrokerError
from streaming.process import pid_alive

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
_HEAP = ["-Xms256m", "-Xmx1g"]


SINGLE_NODE_SETTINGS = {
    "num.partitions": "1",
    # A single node: every internal topic has one replica.
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    # Consumers in tests and the CLI join at once instead of after 3 s.
    "group.initial.rebalance.delay.ms": "0",
}
"""Broker settings of a one-node KRaft cluster (the embedded broker, the tests' secured one)."""


@dataclass(frozen=True)
class EmbeddedBroker:
    """A single-node KRaft broker bound to ``host:port`` (controller on ``controller_port``)."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 9092
    controller_port: int = 9093

    @classmethod
    def from_config(cls, broker: BrokerConfig) -> EmbeddedBroker:
        return cls(broker.data_dir.absolute(), broker.host, broker.port, broker.controller_port)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "broker.log"

    def pid(self) -> int | None:
        """The broker's process id when it is alive, else None."""
        try:
            pid = int((self.data_dir / "broker.pid").read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if pid_alive(pid) else None

    def is_up(self, timeout: float = 2.0) -> bool:
        """True when a broker answers a metadata request at ``bootstrap``."""
        return _answers(self.bootstrap, timeout)

    def start(self, timeout: float = START_TIMEOUT_S) -> str:
        """Start the broker (or reuse the running one) and wait until it answers.

        Returns the bootstrap address. Raises BrokerError when the port belongs
        to another process or the broker does not answer within ``timeout``.
        """
        if self.pid() is not None:
            self._wait_until_up(timeout)
            return self.bootstrap
        for port in (self.port, self.controller_port):
            if _port_in_use(self.host, port):
                raise BrokerError(f"port {self.host}:{port} is in use by another process; "
                                  "stop it or set broker.port / broker.controller_port")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        properties = self.data_dir / "server.properties"
        properties.write_text(self._server_properties())
        classpath = jvm.classpath("kafka_broker")
        if not (self.data_dir / "logs" / "meta.properties").is_file():
            self._format_storage(classpath, properties)
        with self.log_file.open("ab") as log:
            process = subprocess.Popen(
                ["java", *_HEAP, f"-Dlog4j2.configurationFile={conf.path('broker-log4j2.xml')}",
                 "-cp", classpath, "kafka.Kafka", str(properties)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        (self.data_dir / "broker.pid").write_text(f"{process.pid}\n")
        self._wait_until_up(timeout, process)
        return self.bootstrap

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> bool:
        """Stop the broker; return False when it was not running."""
        pid = self.pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.2)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        (self.data_dir / "broker.pid").unlink(missing_ok=True)
        return True

    def _wait_until_up(self, timeout: float, process: subprocess.Popen | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise BrokerError(f"the broker exited with status {process.returncode}; "
                                  f"see {self.log_file}:\n{_tail(self.log_file)}")
            if self.is_up():
                return
            time.sleep(0.5)
        raise BrokerError(f"the broker did not answer at {self.bootstrap} within {timeout:.0f}s; "
                          f"see {self.log_file}")

    def _format_storage(self, classpath: str, properties: Path) -> None:
        cluster_id = "-"
        while cluster_id.startswith("-"):
            # As Kafka's Uuid.randomUuid: an id starting with "-" reads as an option to the tool.
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        result = subprocess.run(
            ["java", *_HEAP, "-cp", classpath, "kafka.tools.StorageTool", "format",
             "-t", cluster_id, "-c", str(properties)],
            capture_output=True, text=True,
        )
        if result.returncode != 0:
            raise BrokerError(f"formatting the broker storage failed: "
                              f"{(result.stderr or result.stdout).strip()[-800:]}")

    def _server_properties(self) -> str:
        listeners = f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}"
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{self.host}:{self.controller_port}",
            "listeners": listeners,
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data_dir / "logs"),
            **SINGLE_NODE_SETTINGS,
            "log.cleaner.backoff.ms": "1000",
        }
        return "".join(f"{k}={v}\n" for k, v in settings.items())


def _answers(bootstrap: str, timeout: float) -> bool:
    # The embedded broker is plaintext on loopback; connection refusals while it
    # starts go to the silent Kafka log.
    admin = kafka.admin(kafka.ClientSettings.of(bootstrap),
                        {"socket.connection.setup.timeout.ms": 1000})
    try:
        admin.list_topics(timeout=timeout)
        return True
    except KafkaException:
        return False


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def free_port() -> int:
    """A TCP port on loopback that is free right now (for tests and ad-hoc brokers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
