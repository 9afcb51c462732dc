"""Kafka for the campaign: one embedded broker, or a 3-node KRaft quorum on loopback,
that the campaign can SIGKILL and bring back.

:class:`ClusterNode` is an :class:`streaming.kafka.broker.EmbeddedBroker` (same jars,
same start/stop, its own data folder) whose ``server.properties`` makes it node
``node_id`` of a quorum whose controllers are ``voters`` (every node is broker and
controller), formatted with the cluster's shared id, with internal topics
replicated ``replicas`` times (``min.insync.replicas`` one less). Topics created
by clients get the broker defaults (one replica): the router's own replication
settings are what the campaign checks. A single-node
:class:`Kafka` uses the product's own EmbeddedBroker unchanged.

:meth:`Kafka.kill` sends SIGKILL to one node and reaps it; :meth:`Kafka.revive`
starts it again on the same ports and data (the broker recovers its log, the
quorum and the partitions' replicas catch up by themselves). :meth:`Kafka.stop`
stops every node that is up, and is what a ``finally`` calls.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from streaming import jvm
from streaming.kafka.broker import _HEAP, BrokerError, EmbeddedBroker, free_port
from streaming.process import pid_alive


@dataclass(frozen=True)
class ClusterNode(EmbeddedBroker):
    """One node of a loopback KRaft quorum (broker + controller)."""

    node_id: int = 1
    voters: str = ""
    cluster_id: str = ""
    replicas: int = 3

    def _format_storage(self, classpath: str, properties: Path) -> None:
        result = subprocess.run(
            ["java", *_HEAP, "-cp", classpath, "kafka.tools.StorageTool", "format",
             "-t", self.cluster_id, "-c", str(properties)],
            capture_output=True, text=True,
        )
        if result.returncode != 0:
            raise BrokerError(f"formatting node {self.node_id} failed: "
                              f"{(result.stderr or result.stdout).strip()[-800:]}")

    def _server_properties(self) -> str:
        single = super()._server_properties().splitlines()
        settings = dict(line.split("=", 1) for line in single if "=" in line)
        isr = str(max(1, self.replicas - 1))
        settings.update({
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.voters,
            "offsets.topic.replication.factor": str(self.replicas),
            "transaction.state.log.replication.factor": str(self.replicas),
            "transaction.state.log.min.isr": isr,
            "share.coordinator.state.topic.replication.factor": str(self.replicas),
            "share.coordinator.state.topic.min.isr": isr,
            # A restarted replica rejoins the ISR quickly on a loaded 2-core machine.
            "replica.lag.time.max.ms": "10000",
            "unclean.leader.election.enable": "false",
            "auto.create.topics.enable": "false",
        })
        return "".join(f"{k}={v}\n" for k, v in settings.items())


class Kafka:
    """``size`` brokers on loopback in ``folder`` (1: the embedded broker; 3: a quorum)."""

    def __init__(self, folder: Path, size: int = 1) -> None:
        self.folder = Path(folder)
        self.size = size
        if size == 1:
            self.nodes: list[EmbeddedBroker] = [EmbeddedBroker(
                self.folder / "kafka", port=free_port(), controller_port=free_port())]
            return
        ports = [(free_port(), free_port()) for _ in range(size)]
        voters = ",".join(f"{i + 1}@127.0.0.1:{c}" for i, (_, c) in enumerate(ports))
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        self.nodes = [ClusterNode(self.folder / f"kafka-{i + 1}", port=p, controller_port=c,
                                  node_id=i + 1, voters=voters, cluster_id=cluster_id,
                                  replicas=size)
                      for i, (p, c) in enumerate(ports)]

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def start(self, timeout: float = 180.0) -> str:
        """Start every node (concurrently: a quorum answers only once a majority is up)."""
        errors: list[BaseException] = []

        def start(node: EmbeddedBroker) -> None:
            try:
                node.start(timeout)
            except BaseException as exc:  # noqa: BLE001 - reported below, after every node had its chance
                errors.append(exc)

        threads = [threading.Thread(target=start, args=(n,)) for n in self.nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout + 30)
        if errors:
            self.stop()
            raise errors[0]
        return self.bootstrap

    def kill(self, index: int = 0) -> float:
        """SIGKILL node ``index`` (no shutdown of any kind); return the time it died."""
        node = self.nodes[index]
        pid = node.pid()
        if pid is None:
            raise BrokerError(f"node {index + 1} is not running")
        os.kill(pid, signal.SIGKILL)
        try:
            os.waitpid(pid, 0)  # our child: reap it, so that its pid is not seen alive
        except ChildProcessError:
            while pid_alive(pid):
                time.sleep(0.1)
        (node.data_dir / "broker.pid").unlink(missing_ok=True)
        return time.time()

    def revive(self, index: int = 0, timeout: float = 180.0) -> float:
        """Start node ``index`` again on its ports and data; return the seconds it took."""
        started = time.monotonic()
        self.nodes[index].start(timeout)
        return time.monotonic() - started

    def pids(self) -> list[int]:
        return [p for p in (n.pid() for n in self.nodes) if p is not None]

    def stop(self) -> None:
        for node in self.nodes:
            try:
                node.stop(timeout=20)
            except OSError:
                pass

    def classpath_ready(self) -> None:
        """Resolve the broker jars once, before timing anything."""
        jvm.classpath("kafka_broker")

