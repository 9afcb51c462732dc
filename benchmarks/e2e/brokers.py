"""RabbitMQ and Mosquitto instances of the benchmark's own: Debian's binaries,
started on loopback ports in a scratch folder, stopped (with everything they
spawned) when the benchmark ends. The system-wide services are never used.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from streaming.kafka.broker import free_port

RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
MOSQUITTO = "/usr/sbin/mosquitto"
START_TIMEOUT_S = 90.0
# Erlang schedulers spin while idle; on a 2-core machine shared with the clients
# that spinning steals the cores the queues need (RabbitMQ's own advice for
# shared hosts is to turn it off).
_ERL_NO_SPIN = "+sbwt none +sbwtdcpu none +sbwtdio none"
STOP_TIMEOUT_S = 30.0


class BrokerStartError(RuntimeError):
    pass


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BrokerStartError(f"exited with {proc.returncode}; see {log}")
        if _port_open(port):
            return
        time.sleep(0.3)
    raise BrokerStartError(f"port {port} not open after {timeout:.0f}s; see {log}")


def _stop_group(proc: subprocess.Popen | None) -> None:
    """SIGTERM the process group we started (start_new_session), then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    pgid = proc.pid  # the session leader's pid is its group id
    try:
        os.killpg(pgid, signal.SIGTERM)
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(pgid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


class _Server:
    """A server started as a session leader, its output in ``log``: what both peers share."""

    proc: subprocess.Popen | None
    port: int

    @property
    def log(self) -> Path:
        """Where the server's output goes (each server's own file)."""
        raise NotImplementedError

    def _launch(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        """Start ``argv`` and wait until it listens on ``port``; stopped again if it does not."""
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            _wait_port(self.port, self.proc, self.log, START_TIMEOUT_S)
        except BrokerStartError:
            self.stop()
            raise

    def pids(self) -> list[int]:
        return _group_pids(self.proc)

    def stop(self) -> None:
        _stop_group(self.proc)


@dataclass
class RabbitMQ(_Server):
    """One RabbitMQ node on 127.0.0.1; AMQP port, Erlang distribution and epmd on loopback."""

    folder: Path
    port: int = field(default_factory=free_port)
    dist_port: int = field(default_factory=free_port)
    epmd_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def log(self) -> Path:
        return self.folder / "rabbitmq.out"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "HOME": str(self.folder),
            "RABBITMQ_NODENAME": f"bench{self.port}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_MNESIA_BASE": str(self.folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.folder / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.folder / "rabbitmq"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.folder / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.folder / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.folder / "rabbitmq.pid"),
            "RABBITMQ_CONF_ENV_FILE": str(self.folder / "rabbitmq-env.conf"),
            # Erlang distribution on loopback only.
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1} " + _ERL_NO_SPIN,
        })
        return env

    def start(self) -> RabbitMQ:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            "loopback_users.guest = true\n"
            "log.console = false\n"
            "log.file.level = info\n")
        (self.folder / "advanced.config").write_text("[].\n")
        (self.folder / "enabled_plugins").write_text("[].\n")
        (self.folder / "rabbitmq-env.conf").write_text("")
        self._launch([RABBITMQ_SERVER], self._env())
        return self

    def stop(self) -> None:
        super().stop()
        # epmd detaches from the node's group: end the one on our port.
        subprocess.run(["epmd", "-port", str(self.epmd_port), "-kill"], env=self._env(),
                       capture_output=True, timeout=15)


@dataclass
class Mosquitto(_Server):
    """One Mosquitto broker listening on 127.0.0.1 only, no persistence."""

    folder: Path
    port: int = field(default_factory=free_port)
    max_queued_messages: int = 100_000
    proc: subprocess.Popen | None = None

    @property
    def log(self) -> Path:
        return self.folder / "mosquitto.out"

    def start(self) -> Mosquitto:
        self.folder.mkdir(parents=True, exist_ok=True)
        conf = self.folder / "mosquitto.conf"
        # max_queued_messages applies to QoS 0 for connected clients since 2.0:
        # a bound far above a burst, so that a drop means a client really lags.
        conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "persistence false\n"
            f"max_queued_messages {self.max_queued_messages}\n"
            "log_type error\nlog_type warning\n"
            f"log_dest file {self.folder / 'mosquitto.log'}\n")
        self._launch([MOSQUITTO, "-c", str(conf)])
        return self


def _group_pids(proc: subprocess.Popen | None) -> list[int]:
    """Every live process in the group of ``proc`` (it was started as a session leader)."""
    if proc is None or proc.poll() is not None:
        return []
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) == proc.pid:
                out.append(int(entry.name))
        except (ProcessLookupError, PermissionError):
            continue
    return out
