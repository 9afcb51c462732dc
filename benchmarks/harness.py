"""What every scenario shares, written once: the machine's load, the broker, the router.

- :func:`machine`: the load average, the cores and the commit, printed by every
  scenario with its figures (:func:`print_machine`), because this machine is shared
  and a figure means little without the load it ran under;
- :func:`start_broker`: the embedded Kafka broker
  (:class:`streaming.kafka.broker.EmbeddedBroker`) on free loopback ports in a folder
  of the scenario's own; the caller stops it. With :data:`BOOTSTRAP_ENV` set (what
  ``python -m benchmarks --bootstrap HOST:PORT`` sets, and the CI smoke test with its
  session broker) it is that running broker instead, which stopping leaves running,
  and :func:`topic_prefix` / :func:`topic_sets` give the scenario's topics names
  of its own in it;
- :class:`RouterRun`: the real ``bitroute run --json`` in a child process (lock,
  watchdog, metrics and all), each finished batch read from its stdout as the
  router reports it (:class:`streaming.cli.progress.BatchJson`); no scenario
  subclasses the router or patches its modules: what a scenario varies it varies
  with ``--set``, as an operator would.

The load driver and the delivery reader are :mod:`benchmarks.e2e.kafka_load`, the
workloads :mod:`benchmarks.workload` (profiles ``devices`` and ``fanout``, end to end and
the compiler's ranked ones).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Self

from benchmarks.e2e import procstat
from streaming.kafka.broker import EmbeddedBroker, free_port

ROOT = Path(__file__).resolve().parents[1]
#: A running broker's ``host:port`` for every scenario to use instead of starting one.
BOOTSTRAP_ENV = "BITROUTE_BENCH_BOOTSTRAP"
STARTED_TIMEOUT_S = 900.0
#: ``bitroute run``'s last start-up line on stderr: the query runs.
_STARTED = re.compile(r"^bitroute: snapshot v(\d+) with (\d+) subscriptions")


def machine() -> dict:
    """The load average (1, 5, 15 min), the cores and the commit of the code under test."""
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "-uno"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        commit, dirty = "unknown", ""
    return {"loadavg": [round(x, 2) for x in os.getloadavg()], "cores": os.cpu_count(),
            "commit": commit + ("+dirty" if dirty else "")}


def print_machine(when: str) -> dict:
    """Print the machine line (``when``: before or after the figures); returns it."""
    m = machine()
    load = " ".join(f"{x:.2f}" for x in m["loadavg"])
    print(f"machine {when}: loadavg {load}, {m['cores']} cores, commit {m['commit']}", flush=True)
    return m


class ExistingBroker:
    """A broker someone else started (:data:`BOOTSTRAP_ENV`): the scenario uses it and
    leaves it running; it has no process of this scenario's to measure."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    def pid(self) -> None:
        return None

    def stop(self) -> bool:
        return True


def existing_bootstrap() -> str | None:
    """The running broker every scenario is to use (:data:`BOOTSTRAP_ENV`), if any."""
    return os.environ.get(BOOTSTRAP_ENV) or None


def start_broker(folder: Path) -> EmbeddedBroker | ExistingBroker:
    """The embedded broker on free loopback ports, its data in ``folder``, started; or
    the running one of :data:`BOOTSTRAP_ENV` (stopping it leaves it running)."""
    existing = existing_bootstrap()
    if existing:
        return ExistingBroker(existing)
    broker = EmbeddedBroker(Path(folder), "127.0.0.1", free_port(), free_port())
    broker.start()
    return broker


_PREFIX = f"bench-{os.getpid()}-{int(time.time())}"


def topic_prefix() -> str:
    """The first part of every topic name this scenario creates: ``bitroute`` (the
    router's defaults) on a broker of its own; on a shared broker one of this process's
    own, so that scenarios run one after another never read each other's records."""
    return _PREFIX if existing_bootstrap() else "bitroute"


def delete_own_topics(timeout: float = 60.0) -> int:
    """On a shared broker, delete the topics this process created (:func:`topic_prefix`),
    so that a run of every scenario leaves the broker as it found it; their number.
    Nothing on a broker of the scenario's own (it is stopped with its data)."""
    bootstrap = existing_bootstrap()
    if not bootstrap:
        return 0
    from streaming import kafka

    admin = kafka.admin(kafka.ClientSettings.of(bootstrap))
    own = [t for t in admin.list_topics(timeout=timeout).topics if t.startswith(_PREFIX + ".")]
    if own:
        for future in admin.delete_topics(own, operation_timeout=timeout).values():
            future.result(timeout)
    return len(own)


def topic_sets() -> list[str]:
    """``bitroute run --set`` flags naming the router's topics after :func:`topic_prefix`
    (none on a broker of the scenario's own: the defaults)."""
    p = topic_prefix()
    if p == "bitroute":
        return []
    return [f"kafka.publishes_topic={p}.publishes", f"kafka.subscriptions_topic={p}.subscriptions",
            f"kafka.rejected_topic={p}.rejected", f"kafka.deliveries_topic_prefix={p}.deliveries.",
            f"kafka.shared_deliveries_topic={p}.deliveries"]


def executable() -> str:
    """The ``bitroute`` command of the running interpreter's environment."""
    found = Path(sys.executable).with_name("bitroute")
    return str(found) if found.exists() else (shutil.which("bitroute") or "bitroute")


class ReportedProcess:
    """A router-like child process whose stdout reports its batches; :attr:`batches`
    holds each as a dict with ``rows``, ``deliveries``, ``seconds``, ``end`` (wall
    clock, Unix seconds) and the seconds of each stage by name. Subclasses parse."""

    def __init__(self, command: list[str], log_path: Path, env: dict | None = None,
                 cwd: Path = ROOT) -> None:
        self.command, self.log_path, self.env, self.cwd = command, Path(log_path), env, cwd
        self.batches: list[dict] = []
        self.started: dict | None = None
        self._events: queue.Queue = queue.Queue()
        self._t0 = 0.0
        self.proc: subprocess.Popen | None = None

    def start(self) -> Self:
        self._t0 = time.time()
        self.proc = proc = subprocess.Popen(self.command, cwd=self.cwd, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True, env=self.env,
                                            start_new_session=True)
        threading.Thread(target=self._read_stdout, args=(proc,), daemon=True).start()
        threading.Thread(target=self._read_stderr, args=(proc,), daemon=True).start()
        return self

    def popen(self) -> subprocess.Popen:
        """The process, once :meth:`start`ed."""
        if self.proc is None:
            raise RuntimeError(f"{self.command[0]}: not started")
        return self.proc

    def _read_stdout(self, proc: subprocess.Popen) -> None:
        with open(self.log_path.with_suffix(".stdout"), "a") as log:
            for line in proc.stdout or ():
                log.write(line)
                log.flush()
                self.parse_stdout(line)
        self._events.put("exit")

    def _read_stderr(self, proc: subprocess.Popen) -> None:
        with open(self.log_path, "a") as log:
            for line in proc.stderr or ():
                log.write(line)
                log.flush()
                self.parse_stderr(line)

    def parse_stdout(self, line: str) -> None:
        raise NotImplementedError

    def parse_stderr(self, line: str) -> None:
        pass

    def _mark_started(self, **figures) -> None:
        self.started = {"open_s": time.time() - self._t0, **figures}
        self._events.put("started")

    def wait_started(self, timeout: float = STARTED_TIMEOUT_S) -> dict:
        try:
            event = self._events.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"the router did not start in {timeout:.0f}s; see {self.log_path}") from None
        if event != "started" or self.started is None:
            raise RuntimeError(f"the router exited before its query started; see {self.log_path}")
        return self.started

    def routed(self) -> int:
        return sum(b["rows"] for b in self.batches)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_routed(self, total: int, timeout: float) -> bool:
        """True once ``total`` publishes are routed in all; False at ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.routed() >= total:
                return True
            if self.proc and self.proc.poll() is not None:
                raise RuntimeError(f"the router exited; see {self.log_path}")
            time.sleep(0.2)
        return False

    def pids(self) -> dict[str, list[int]]:
        proc = self.proc
        return {"jvm": [proc.pid] if proc is not None and proc.poll() is None else []}

    def stop(self, timeout: float = 120) -> None:
        """SIGTERM (stop after the batch in progress); SIGKILL of its whole session (the
        Spark JVM and Python workers too) after ``timeout`` or once it has exited."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


class RouterRun(ReportedProcess):
    """``bitroute run --json --set ...`` (and ``--config FILE``): the router as operators
    run it, in a session of its own, its code from ``pythonpath`` (default: this
    checkout). ``started`` is its start-up line (the query runs): ``open_s`` from the
    process's start (Spark's included), ``subscriptions``, ``version``."""

    def __init__(self, sets: list[str], log_path: Path, config_file: Path | None = None,
                 pythonpath: Path = ROOT, cwd: Path = ROOT) -> None:
        command = [executable(), "run", "--json"]
        if config_file is not None:
            command += ["--config", str(config_file)]
        for s in sets:
            command += ["--set", s]
        env = dict(os.environ, PYTHONPATH=str(pythonpath))
        super().__init__(command, log_path, env, cwd)

    def parse_stdout(self, line: str) -> None:
        report = json.loads(line)
        self.batches.append({**report, **report["stages"], "end": report["finished_at"]})

    def parse_stderr(self, line: str) -> None:
        m = _STARTED.match(line)
        if m and self.started is None:
            self._mark_started(version=int(m.group(1)), subscriptions=int(m.group(2)))

    def pids(self) -> dict[str, list[int]]:
        """Role -> pids: the Python driver, the Spark JVM, the Python workers."""
        if self.proc is None or self.proc.poll() is not None:
            return {"driver": [], "jvm": [], "workers": []}
        kids = procstat.children(self.proc.pid)
        commands = {p: procstat.cmdline(p) for p in kids}
        jvm = [p for p, command in commands.items() if "java" in command.split(" ")[0]]
        # The JVM's class path names pyspark's folders too: only its non-JVM children are workers.
        workers = [p for p, command in commands.items()
                   if p not in jvm and ("pyspark" in command or "python" in command)
                   and "streaming.state.watchdog" not in command]
        return {"driver": [self.proc.pid], "jvm": jvm, "workers": workers}
