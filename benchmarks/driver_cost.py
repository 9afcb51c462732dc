"""Driver cost on a cluster (issue 28): the CPU the router's driver spends per
delivery when the executors route every batch.

    python -m benchmarks driver-cost [--before /work/wt-before] [--pairs 2]
                                     [--batch 30000] [--sweep 5000,15000] [--tiny 500]

Each run starts everything it uses on loopback, in a folder of its own, and
stops it all at the end (or at ``--timeout``):

- a Spark standalone cluster: a master and two one-core workers (``--workers``), started from
  pyspark's own ``spark-class`` with the run's ``PYTHONPATH`` (so the executors'
  Python workers import the code under test);
- the embedded Kafka broker (:class:`streaming.kafka.broker.EmbeddedBroker`) on
  free ports;
- the workload (:func:`fanout_workload`): ``--subscribers`` subscribers
  (200) in groups of ``--fanout`` (10), each publish matching exactly one
  group, so every publish makes ``--fanout`` deliveries; the subscriptions are
  written to the changelog and a backlog of ``--backlog`` publishes (60,000) is
  produced (:mod:`benchmarks.e2e.kafka_load`) before the router starts;
- the router: the real ``bitroute run`` in a subprocess of its own session,
  ``--set spark.master=spark://...`` and
  ``streaming.driver_route_max_publishes=0`` (every batch routed on the
  executors), ``streaming.max_offsets_per_trigger`` the run's batch size, its
  own checkpoint and warehouse folders.

Measured from the first delivery (the earliest Kafka timestamp of a delivery
record, set by the executor's producer) until every delivery has been consumed
from the delivery topics and the audit tables (read with delta-rs) hold a
``messages`` row per publish and a ``deliveries`` row per delivery. CPU is utime + stime from ``/proc/<pid>/stat``
(:mod:`benchmarks.e2e.procstat`), sampled every ``--sample`` seconds:

- driver: the ``bitroute run`` process (Python) and its descendants: its
  Spark JVM and the JVM watchdog;
- executors: the executor JVMs the workers launched and their Python workers;
- cluster daemons (the master and the workers' JVMs) and the Kafka broker are
  shown apart, not counted in the router's CPU.

``--local N`` runs the router on a ``local[N]`` master instead (no cluster): its
executors are threads of the driver's JVM, so "driver JVM" holds the routing too,
and "executor Python" is the JVM's Python workers (``pyspark.daemon``), apart from
the driver's own Python process. Realtime mode is measured with
``--set streaming.mode=realtime --set kafka.partitions=1`` (a slot per publishes
partition plus one for the audit query).

``--before TREE`` runs a second checkout (e.g. a worktree of the commit before
issue 28, ``git worktree add /work/wt-before f0324da``) with the same
settings, alternating with this tree run by run (ABAB): both use this Python
(the shared virtualenv and its kernel); only ``PYTHONPATH`` differs. The
figures are printed per run, then min and median per (code, batch size).

Run by hand, never in CI: two to five minutes per run on a busy 2-core machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path

import pyspark
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from benchmarks import harness
from benchmarks.e2e import kafka_load, procstat
from benchmarks.workload import EXCHANGE, Workload, match_stats
from streaming import kafka
from streaming.config import load, parse_set_flags
from streaming.kafka.broker import EmbeddedBroker, free_port
from streaming.kafka.topics import ensure_delivery_topics, ensure_router_topics

ROOT = Path(__file__).resolve().parents[1]
GROUP_TOPICS = 50
"""Distinct topics per subscriber group (``g<k>/dev<d>/<metric>``)."""


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- workload --------------------------------------------------------------------------------

def fanout_workload(subscribers: int, fanout: int, publishes: int, seed: int = 1) -> Workload:
    """``subscribers`` subscribers in groups of ``fanout``; group ``k`` follows
    ``g<k>/...`` (half of them with ``g<k>/#``, half with ``g<k>/+/+``), and each
    publish goes to one group's topic, uniformly: exactly ``fanout`` deliveries
    per publish, to distinct subscribers."""
    if subscribers % fanout:
        raise SystemExit(f"--subscribers {subscribers} is not a multiple of --fanout {fanout}")
    import random
    groups = subscribers // fanout
    subs = []
    for i in range(subscribers):
        group = i % groups
        filt = f"g{group}/#" if (i // groups) % 2 == 0 else f"g{group}/+/+"
        subs.append((f"s{i}", f"sub{i:04d}", filt))
    rng = random.Random(f"driver_cost/{subscribers}/{fanout}/{seed}")
    pubs = [f"g{rng.randrange(groups)}/dev{rng.randrange(GROUP_TOPICS)}/m{rng.randrange(4)}"
            for _ in range(publishes)]
    return Workload("groups", subscribers, seed, subs, pubs,
                    f"MQTT g<k>/dev<d>/m<m>: {subscribers} subscribers in {groups} groups of "
                    f"{fanout} ('g<k>/#' or 'g<k>/+/+'); publishes uniform over the groups")


# --- processes -------------------------------------------------------------------------------

@dataclass
class Cluster:
    url: str
    master: subprocess.Popen | None  # None: a local master (--local)
    workers: list[subprocess.Popen]

    @property
    def processes(self) -> list[subprocess.Popen]:
        return [*([self.master] if self.master is not None else []), *self.workers]


@contextlib.contextmanager
def standalone_cluster(folder: Path, pythonpath: str, workers: int = 2) -> Iterator[Cluster]:
    """A Spark standalone master and ``workers`` one-core workers on 127.0.0.1, started
    from pyspark's own ``spark-class`` with ``PYTHONPATH=pythonpath`` (the executors
    inherit it); each in a session of its own, killed with its process group on exit."""
    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(folder / "logs"),
               PYTHONPATH=pythonpath)
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    logs = (folder / "cluster.log").open("a")
    started: list[subprocess.Popen] = []
    try:
        started.append(subprocess.Popen(
            [str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(port), "--webui-port", str(free_port())],
            env=env, stdout=logs, stderr=subprocess.STDOUT, start_new_session=True))
        for i in range(workers):
            started.append(subprocess.Popen(
                [str(spark_class), "org.apache.spark.deploy.worker.Worker", url, "--host",
                 "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port",
                 str(free_port()), "--work-dir", str(folder / f"worker-{i}")],
                env=env, stdout=logs, stderr=subprocess.STDOUT, start_new_session=True))
        yield Cluster(url, started[0], started[1:])
    finally:
        for process in started:
            _kill_group(process, signal.SIGTERM)
        for process in started:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                _kill_group(process, signal.SIGKILL)
                process.wait(timeout=20)
        logs.close()


def _kill_group(process: subprocess.Popen, sig: int) -> None:
    """Signal ``process``'s process group (it leads a session of its own) and any
    descendant that left it."""
    for pid in procstat.children(process.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


# --- CPU over time ---------------------------------------------------------------------------

class CpuTimeline:
    """Cumulative CPU seconds per role, sampled every ``interval`` seconds in a thread.

    A role is a function from the current process tree (pid -> children) to its pids.
    A process first seen after the first sample counts from its start (its whole
    utime + stime); one that exits loses at most one interval.
    """

    def __init__(self, roles: dict[str, Callable[[dict[int, list[int]]], list[int]]],
                 interval: float) -> None:
        self.roles = roles
        self.interval = interval
        self.samples: list[tuple[float, dict[str, float]]] = []  # (epoch s, role -> cpu s)
        self._last: dict[int, float] = {}
        self._total = {name: 0.0 for name in roles}
        self._first = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> CpuTimeline:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(self.interval):
                self._sample()
                return

    def _sample(self) -> None:
        tree = process_tree()
        now = time.time()
        for name, pids_of in self.roles.items():
            for pid in set(pids_of(tree)):
                cpu = procstat.cpu_seconds(pid)
                before = self._last.get(pid, cpu if self._first else 0.0)
                self._total[name] += max(0.0, cpu - before)
                self._last[pid] = cpu
        self._first = False
        self.samples.append((now, dict(self._total)))

    def at(self, when: float) -> dict[str, float]:
        """Each role's cumulative CPU at epoch ``when``, interpolated between samples."""
        samples = self.samples
        if not samples:
            return dict.fromkeys(self.roles, 0.0)
        if when <= samples[0][0]:
            return dict(samples[0][1])
        for (t0, c0), (t1, c1) in pairwise(samples):
            if t0 <= when <= t1:
                f = (when - t0) / (t1 - t0) if t1 > t0 else 1.0
                return {k: c0[k] + f * (c1[k] - c0[k]) for k in c0}
        return dict(samples[-1][1])

    def between(self, start: float, end: float) -> dict[str, float]:
        a, b = self.at(start), self.at(end)
        return {k: b[k] - a[k] for k in a}


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (utime + stime) of ``pid``'s threads, summed by thread name with its
    numbers dropped (``GC Thread#3`` -> ``GC Thread#``)."""
    out: dict[str, float] = {}
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for entry in os.scandir(f"/proc/{pid}/task"):
            try:
                with open(f"{entry.path}/stat") as f:
                    head, rest = f.read().rsplit(")", 1)
            except (FileNotFoundError, ProcessLookupError):
                continue
            name = re.sub(r"[0-9]+", "", head.split("(", 1)[1]).strip() or "?"
            fields = rest.split()
            out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / _TICK
    return out


_TICK = os.sysconf("SC_CLK_TCK")


def process_tree() -> dict[int, list[int]]:
    """pid -> its children's pids, from /proc."""
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(tree: dict[int, list[int]], pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for child in tree.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


def _is_java(pid: int) -> bool:
    command = procstat.cmdline(pid).split(" ", 1)[0]
    return command.endswith("/java") or command == "java"


@contextlib.contextmanager
def no_cluster(master: str) -> Iterator[Cluster]:
    """``--local``: the router's own ``local[N]`` master, no process of its own."""
    yield Cluster(master, None, [])


def _is_python_worker(pid: int) -> bool:
    return "pyspark.daemon" in procstat.cmdline(pid) or "pyspark/daemon" in procstat.cmdline(pid)


def router_roles(router: harness.RouterRun, cluster: Cluster, broker: EmbeddedBroker | harness.ExistingBroker) -> dict:
    driver = router.popen().pid
    workers = [p.pid for p in cluster.workers]
    local = cluster.master is None

    def driver_jvm(tree):
        return [p for p in descendants(tree, driver) if _is_java(p)]

    def local_workers(tree):
        # A local master's Python workers: the daemon the driver JVM forks, and its forks.
        daemons = [p for p in descendants(tree, driver) if _is_python_worker(p)]
        return daemons + [c for d in daemons for c in descendants(tree, d)]

    def driver_python(tree):
        workers_now = set(local_workers(tree)) if local else set()
        return [driver] + [p for p in descendants(tree, driver)
                           if not _is_java(p) and p not in workers_now]

    def executors(tree, java: bool):
        # The worker daemon's own JVM is not an executor: only its descendants are.
        return [p for w in workers for p in descendants(tree, w) if _is_java(p) == java]

    return {
        "driver Python": driver_python,
        "driver JVM": driver_jvm,
        "executor JVMs": lambda tree: executors(tree, True),
        "executor Python": lambda tree: list(set(local_workers(tree))) if local
        else executors(tree, False),
        "cluster daemons": lambda tree: [p.pid for p in cluster.processes if p is not None],
        "Kafka broker": lambda tree: [p for p in [broker.pid()] if p],
    }


# --- what is watched: deliveries consumed, messages audited ---------------------------------

class DeliveryCounter:
    """Counts the records of the delivery topics from their beginning, in a thread, until
    stopped. ``first_timestamp``: the earliest record timestamp at or after ``mark`` (epoch
    s; the first delivery of the measured publishes); ``done_at``: when ``expected``
    records had been read (both reset by :meth:`expect`)."""

    def __init__(self, config, topics: list[str], partitions: int, expected: int) -> None:
        self.count = 0
        self.expect(expected, 0.0)
        self._consumer = kafka.consumer(config.kafka.client_settings,
                                        f"driver-cost-{time.time_ns()}",
                                        {"fetch.wait.max.ms": 50, "enable.auto.commit": False})
        self._consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING)
                               for t in topics for p in range(partitions)])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def expect(self, expected: int, mark: float) -> None:
        self.expected, self.mark = expected, mark
        self.first_timestamp: float | None = None
        self.done_at: float | None = None

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                records = self._consumer.consume(10_000, 0.2)
                good = [r for r in records if r.error() is None]
                if good:
                    first = min((t for t in (r.timestamp()[1] / 1000.0 for r in good)
                                 if t >= self.mark), default=None)
                    if first is not None and (self.first_timestamp is None
                                              or first < self.first_timestamp):
                        self.first_timestamp = first
                    self.count += len(good)
                if self.done_at is None and self.count >= self.expected:
                    self.done_at = time.time()
        finally:
            self._consumer.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _drain(router: harness.RouterRun, counter: DeliveryCounter, messages: str, publishes: int,
           deadline: float, result: RunResult, timeout: float) -> tuple[dict[str, float], float]:
    """Wait until ``counter`` has its deliveries, the ``messages`` table ``publishes`` rows
    and the ``deliveries`` table a row per delivery (the two tables are committed apart:
    the larger one last); note the load average and the driver JVM's threads at the first delivery.
    Returns those threads' CPU and when the audit was complete."""
    audited_at = None
    threads_start: dict[str, float] = {}
    deliveries = messages.rsplit("/", 1)[0] + "/deliveries"
    while time.monotonic() < deadline:
        if not router.alive():
            raise RuntimeError(f"the router exited; see {router.log_path}")
        if counter.first_timestamp is not None and not result.load_start:
            result.load_start = os.getloadavg()[0]
            threads_start = _driver_jvm_threads(router)
        if counter.count and audited_at is None:
            if (audited_rows(messages) >= publishes
                    and audited_rows(deliveries) >= counter.expected):
                audited_at = time.time()
        if counter.done_at is not None and audited_at is not None:
            return threads_start, audited_at
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {timeout:.0f}s: {counter.count:,} of "
                       f"{counter.expected:,} deliveries consumed, audit "
                       f"{'complete' if audited_at else 'incomplete'}")


def audited_rows(path: str) -> int:
    """Rows of the audit table at ``path`` (0 before it exists)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError
    try:
        return DeltaTable(path).count()
    except TableNotFoundError:  # not created yet
        return 0


# --- one run ---------------------------------------------------------------------------------

@dataclass
class RunResult:
    code: str
    tree: str
    batch: int
    backlog: int
    warm: bool = False
    """Measured on a second backlog, produced after the router drained a first one."""
    deliveries: int = 0
    batches: int = 0
    routed_in: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    load_start: float = 0.0
    load_end: float = 0.0
    idle_driver_per_s: float = 0.0
    """Driver CPU seconds per second with nothing left to route (after the drain)."""
    ok: bool = False
    error: str = ""
    steady_batches: int = 0
    steady_deliveries: int = 0
    steady_driver_s: float = 0.0
    """Driver CPU from the end of the first batch to the end of the last full one: the
    batches after the first, without the first batch's warm-up (the JVM's JIT, the
    executors' Python workers) and the audit's last commit."""
    steady_executors_s: float = 0.0
    idle_driver_python_per_s: float = 0.0
    driver_jvm_threads: dict[str, float] = field(default_factory=dict)
    """The driver JVM's CPU seconds in the measured span by thread name, largest first."""
    stages_s: dict[str, float] = field(default_factory=dict)
    """Each stage's seconds summed over the measured batches (their reports' ``stages``)."""
    idle_jvm_threads: dict[str, float] = field(default_factory=dict)
    """The same while the router was idle after the drain (``--idle`` seconds)."""

    @property
    def driver_s(self) -> float:
        return self.cpu.get("driver Python", 0.0) + self.cpu.get("driver JVM", 0.0)

    @property
    def executors_s(self) -> float:
        return self.cpu.get("executor JVMs", 0.0) + self.cpu.get("executor Python", 0.0)

    @property
    def driver_per_million(self) -> float:
        return self.driver_s / max(self.deliveries, 1) * 1e6

    @property
    def driver_share(self) -> float:
        return self.driver_s / max(self.driver_s + self.executors_s, 1e-9)

    @property
    def driver_per_batch(self) -> float:
        return self.driver_s / max(self.batches, 1)

    @property
    def steady_per_million(self) -> float:
        return self.steady_driver_s / max(self.steady_deliveries, 1) * 1e6

    @property
    def steady_per_batch(self) -> float:
        return self.steady_driver_s / max(self.steady_batches, 1)

    @property
    def steady_share(self) -> float:
        return self.steady_driver_s / max(self.steady_driver_s + self.steady_executors_s, 1e-9)


def _produce_backlog(config, w: Workload) -> dict:
    """``w``'s publishes produced at once, every one acked (else RuntimeError)."""
    procs, out, _ = kafka_load.start_publishers(
        config.kafka.client_settings, config.kafka.publishes_topic, EXCHANGE, w, 0,
        600, processes=1, count=len(w.publishes), start_at=time.time())
    sent = kafka_load.join_publishers(procs, out, timeout=300)
    if sent["sent"] != len(w.publishes) or sent["unacked"]:
        raise RuntimeError(f"the backlog was not produced whole: {sent}")
    return sent


def run_once(code: str, tree: Path, batch: int, w: Workload, fanout: int, folder: Path,
             timeout: float, sample: float, idle: float, warm: bool = False,
             extra_sets: tuple[str, ...] = (), workers: int = 2,
             local: int = 0) -> RunResult:
    """One measured drain of ``w``'s publishes by a router of ``tree`` on a fresh cluster
    and broker in ``folder``; everything started is stopped before returning."""
    result = RunResult(code, str(tree), batch, len(w.publishes), warm=warm)
    expected = len(w.publishes) * fanout
    deadline = time.monotonic() + timeout
    folder.mkdir(parents=True)
    broker = None
    try:
        # The router, its CPU sampler and the consumer stop before the cluster does.
        spark = no_cluster(f"local[{local}]") if local else standalone_cluster(
            folder, str(tree), workers)
        with spark as cluster, contextlib.ExitStack() as stops:
            broker = harness.start_broker(folder / "kafka")
            sets = [
                "broker.embedded=false",
                f"kafka.bootstrap={broker.bootstrap}",
                *harness.topic_sets(),
                f"delta.warehouse={folder / 'delta'}",
                f"streaming.checkpoint_dir={folder / 'checkpoints'}",
                f"streaming.max_offsets_per_trigger={batch}",
                "streaming.driver_route_max_publishes=0",
                f"spark.master={cluster.url}",
                "spark.options.spark.executor.memory=512m",
                "spark.log_level=WARN",
                *extra_sets,
            ]
            config = load(None, parse_set_flags(sets), environ={})
            ensure_router_topics(config)
            subscribers = {s for _, s, _ in w.subs}
            ensure_delivery_topics(config, subscribers)
            topics = sorted({config.kafka.layout.topic(s) for s in subscribers})
            kafka_load.load_changelog(config.kafka.client_settings,
                                      config.kafka.subscriptions_topic, w, EXCHANGE)
            sent = _produce_backlog(config, w)
            _log(f"{code} batch {batch:,}: backlog of {sent['sent']:,} publishes produced; "
                 "starting the router")
            counter = DeliveryCounter(config, topics, config.kafka.layout.partitions, expected)
            stops.callback(counter.stop)
            router = harness.RouterRun(sets, folder / "router.log", pythonpath=tree,
                                       cwd=folder).start()
            stops.callback(router.stop)
            timeline = CpuTimeline(router_roles(router, cluster, broker), sample).start()
            stops.callback(timeline.stop)
            messages = config.delta.table_path("messages")
            if warm:
                # The same backlog once more, routed by the warm router (its JVM's JIT
                # done, the executors' Python workers up), produced while it runs.
                _drain(router, counter, messages, len(w.publishes), deadline, result, timeout)
                _log(f"{code} batch {batch:,}: warm-up drained; producing the measured backlog")
                mark = time.time()
                counter.expect(2 * expected, mark)
                first_batch = len(router.batches)
                _produce_backlog(config, w)
                result.load_start = 0.0
            else:
                first_batch = 0
            threads_start, audited_at = _drain(router, counter, messages,
                                               len(w.publishes) * (2 if warm else 1), deadline,
                                               result, timeout)
            result.load_end = os.getloadavg()[0]
            threads_end = _driver_jvm_threads(router)
            result.driver_jvm_threads = _thread_diff(threads_start, threads_end)
            start, done = counter.first_timestamp, counter.done_at
            if start is None or done is None:  # _drain returns once both are known
                raise RuntimeError("the drain returned before its first and last delivery")
            end = max(done, audited_at)
            # The router idle (no publishes left): what the driver costs per second
            # whatever it routes.
            time.sleep(max(0.0, end + 0.5 - time.time()))
            idle_threads_start = _driver_jvm_threads(router)
            time.sleep(idle + sample * 1.5)
            idle_threads_end = _driver_jvm_threads(router)
            timeline.stop()
            quiet = timeline.between(end + 0.5, end + 0.5 + idle) if idle else {}
            result.idle_driver_per_s = (quiet.get("driver Python", 0.0)
                                        + quiet.get("driver JVM", 0.0)) / idle if idle else 0.0
            result.idle_driver_python_per_s = quiet.get("driver Python", 0.0) / idle if idle else 0.0
            result.idle_jvm_threads = _thread_diff(idle_threads_start, idle_threads_end)
            result.wall_s = end - start
            result.cpu = timeline.between(start, end)
            result.deliveries = counter.count - (expected if warm else 0)
            counted = [b for b in router.batches[first_batch:] if b["rows"]]
            result.batches = len(counted)
            result.routed_in = sorted({b["routed_in"] for b in counted})
            for b in counted:
                for stage, seconds in (b.get("stages") or {}).items():
                    result.stages_s[stage] = round(result.stages_s.get(stage, 0.0) + seconds, 3)
            full = [b for b in counted[1:] if b["rows"] >= 0.5 * batch]
            if full:
                cpu = timeline.between(counted[0]["end"], full[-1]["end"])
                result.steady_batches = len(full)
                result.steady_deliveries = sum(b["deliveries"] for b in full)
                result.steady_driver_s = cpu["driver Python"] + cpu["driver JVM"]
                result.steady_executors_s = cpu["executor JVMs"] + cpu["executor Python"]
            result.ok = True
    except Exception as exc:  # noqa: BLE001 - one failed run is reported, the others still run
        result.error = f"{type(exc).__name__}: {exc}"
        _log(f"{code} batch {batch:,}: FAILED: {result.error}")
    finally:
        if broker is not None:
            broker.stop()
    return result


def _thread_diff(start: dict[str, float], end: dict[str, float]) -> dict[str, float]:
    """CPU seconds per thread name between two :func:`_driver_jvm_threads`, largest first."""
    return dict(sorted(((k, round(v - start.get(k, 0.0), 2)) for k, v in end.items()
                        if v - start.get(k, 0.0) >= 0.01), key=lambda kv: -kv[1]))


def _driver_jvm_threads(router: harness.RouterRun) -> dict[str, float]:
    tree = process_tree()
    out: dict[str, float] = {}
    for pid in descendants(tree, router.popen().pid):
        if _is_java(pid):
            for name, cpu in thread_cpu(pid).items():
                out[name] = out.get(name, 0.0) + cpu
    return out


# --- report ----------------------------------------------------------------------------------

def run_line(r: RunResult) -> str:
    if not r.ok:
        return f"{r.code:6} {r.batch:>7,}  FAILED: {r.error}"
    return (f"{r.code:6} {r.batch:>7,} {r.deliveries:>9,} {r.batches:>4} "
            f"{r.cpu['driver Python']:>6.2f} {r.cpu['driver JVM']:>6.2f} {r.driver_s:>7.2f} "
            f"{r.driver_per_million:>8.2f} {r.driver_per_batch:>7.3f} "
            f"{r.cpu['executor JVMs']:>6.2f} {r.cpu['executor Python']:>6.2f} "
            f"{r.executors_s:>7.2f} {r.driver_share:>6.1%} {r.wall_s:>6.1f} "
            f"{r.cpu['cluster daemons']:>6.2f} {r.cpu['Kafka broker']:>6.2f} "
            f"{r.load_start:>5.1f} {r.load_end:>5.1f} {r.idle_driver_per_s:>6.3f} | "
            f"{r.steady_batches:>3} {r.steady_driver_s:>6.2f} {r.steady_per_million:>7.2f} "
            f"{r.steady_per_batch:>7.3f} {r.steady_share:>6.1%}  {','.join(r.routed_in)}")


HEADER = ("code     batch deliveries  bat  drvPy drvJVM driver  drv/1M  drv/bat "
          "exJVM   exPy  execs  share   wall daemon broker  load0 load1 idle/s | "
          "bat driver  drv/1M drv/bat  share  routed in\n"
          "(left of |: from the first delivery until all were consumed and audited; right: "
          "the steady batches, those after the first)")


def summary(results: list[RunResult]) -> list[str]:
    lines = []
    keys = sorted({(r.code, r.batch) for r in results if r.ok}, key=lambda k: (k[1], k[0]))
    for code, batch in keys:
        group = [r for r in results if r.ok and (r.code, r.batch) == (code, batch)]

        def stat(f: Callable[[RunResult], float], fmt: str, group: list[RunResult] = group) -> str:
            values = [f(r) for r in group]
            return f"{format(min(values), fmt)}/{format(statistics.median(values), fmt)}"

        lines.append(
            f"{code:6} batch {batch:>7,} ({len(group)} runs, min/median): driver CPU "
            f"{stat(lambda r: r.driver_s, '.2f')} s, per million deliveries "
            f"{stat(lambda r: r.driver_per_million, '.2f')} s, per batch "
            f"{stat(lambda r: r.driver_per_batch, '.3f')} s; executors "
            f"{stat(lambda r: r.executors_s, '.2f')} s; driver share "
            f"{stat(lambda r: r.driver_share, '.1%')}; wall {stat(lambda r: r.wall_s, '.1f')} s"
            + (f"; steady (batches after the first): driver per million deliveries "
               f"{stat(lambda r: r.steady_per_million, '.2f')} s, per batch "
               f"{stat(lambda r: r.steady_per_batch, '.3f')} s, share "
               f"{stat(lambda r: r.steady_share, '.1%')}"
               if all(r.steady_batches for r in group) else ""))
    for batch in sorted({r.batch for r in results if r.ok}):
        before = [r.driver_per_million for r in results if r.ok and r.code == "before"
                  and r.batch == batch]
        after = [r.driver_per_million for r in results if r.ok and r.code == "after"
                 and r.batch == batch]
        if before and after:
            lines.append(
                f"batch {batch:,}: driver CPU per million deliveries, before / after = "
                f"{statistics.median(before) / statistics.median(after):.1f}x (medians), "
                f"{min(before) / min(after):.1f}x (minima)")
        before = [r.steady_per_million for r in results if r.ok and r.code == "before"
                  and r.batch == batch and r.steady_batches]
        after = [r.steady_per_million for r in results if r.ok and r.code == "after"
                 and r.batch == batch and r.steady_batches]
        if before and after:
            lines.append(
                f"batch {batch:,}, steady: before / after = "
                f"{statistics.median(before) / statistics.median(after):.1f}x (medians), "
                f"{min(before) / min(after):.1f}x (minima)")
    return lines


def capacity(results: list[RunResult], target: float) -> list[str]:
    """On paper, from the median figures of this code's largest batch size: the
    deliveries per second one driver core coordinates at that size (deliveries per batch
    over the driver's CPU per batch, c), the executor cores for ``target`` deliveries/s,
    and the smallest batch that lets one driver keep up with twice those cores. A
    micro-batch's driver work is serial with its tasks: a batch of D deliveries takes
    c + D / (N r) on N executor cores of r deliveries/s each and must take at most
    D / target; with N r = 2 target that is D >= 2 c target."""
    after = [r for r in results if r.ok and r.code == "after"]
    if not after:
        return []
    batch = max(r.batch for r in after)
    group = [r for r in after if r.batch == batch]
    if not all(r.executors_s for r in group):
        return []  # --local: the executors are the driver JVM's threads
    per_batch = statistics.median(r.driver_per_batch for r in group)
    per_batch_deliveries = statistics.median(r.deliveries / max(r.batches, 1) for r in group)
    exec_rate = 1 / statistics.median(r.executors_s / r.deliveries for r in group)
    return [
        f"on paper (after, batches of {batch:,} publishes, medians): the driver spends "
        f"{per_batch:.2f} CPU s per batch of {per_batch_deliveries:,.0f} deliveries, so one "
        f"driver core coordinates {per_batch_deliveries / per_batch:,.0f} deliveries/s; one "
        f"executor core routes {exec_rate:,.0f} deliveries/s; {target:,.0f} deliveries/s "
        f"needs {target / exec_rate:,.0f} executor cores at full load, and with twice that "
        f"many one driver keeps up with batches of at least {2 * per_batch * target:,.0f} "
        f"deliveries ({2 * per_batch:.2f} s per batch)"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks driver-cost", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, default=None,
                    help="a checkout of the code to compare with (e.g. /work/wt-before at "
                         "f0324da); runs alternate before/after")
    ap.add_argument("--pairs", type=int, default=2,
                    help="runs of each code at --batch (alternating when --before is given)")
    ap.add_argument("--batch", type=int, default=30_000,
                    help="streaming.max_offsets_per_trigger of the compared runs")
    ap.add_argument("--sweep", default="5000,15000",
                    help="further batch sizes, run once each with this tree ('' for none)")
    ap.add_argument("--sweep-before", action="store_true",
                    help="run the sweep's batch sizes with --before too")
    ap.add_argument("--tiny", type=int, default=500,
                    help="a run of tiny batches for the driver's fixed cost per batch (0: none)")
    ap.add_argument("--tiny-backlog", type=int, default=10_000)
    ap.add_argument("--backlog", type=int, default=60_000, help="publishes per run")
    ap.add_argument("--subscribers", type=int, default=200)
    ap.add_argument("--fanout", type=int, default=10, help="deliveries per publish")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run, all in")
    ap.add_argument("--sample", type=float, default=0.5, help="CPU sampling interval, seconds")
    ap.add_argument("--idle", type=float, default=10.0,
                    help="seconds of the idle router measured after each drain (0: none)")
    ap.add_argument("--target", type=float, default=10e6, help="deliveries/s, for the paper sizing")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="a further `bitroute run --set` for every run (both codes)")
    ap.add_argument("--warm", action="store_true",
                    help="measure a second backlog, produced once the router has drained a "
                         "first one (a warm JVM and warm Python workers), instead of the first")
    ap.add_argument("--threads", action="store_true",
                    help="print the driver JVM's CPU in the measured span by thread name")
    ap.add_argument("--folder", type=Path, default=None,
                    help="where the runs' folders go (default: a temporary folder, removed)")
    ap.add_argument("--keep", action="store_true", help="keep the runs' folders")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--workers", type=int, default=2,
                    help="one-core workers of the standalone cluster")
    ap.add_argument("--local", type=int, default=0, metavar="N",
                    help="run the router on a local[N] master instead of a standalone cluster")
    ap.add_argument("--smoke", action="store_true",
                    help="toy size: one run of 2,000 publishes in batches of 1,000 on one "
                         "worker, no sweep")
    args = ap.parse_args(argv)
    if args.smoke:
        args.pairs, args.batch, args.sweep, args.tiny = 1, 1000, "", 0
        args.backlog, args.subscribers, args.idle, args.timeout = 2000, 50, 0.0, 300.0
        args.workers = 1

    after_tree = ROOT
    w = fanout_workload(args.subscribers, args.fanout, args.backlog)
    matched, distinct = match_stats(w)
    if round(distinct) != args.fanout or matched != distinct:
        raise SystemExit(f"the workload's fan-out is {matched:.2f}, not {args.fanout}")
    tiny = fanout_workload(args.subscribers, args.fanout, args.tiny_backlog)

    plan: list[tuple[str, Path, int, Workload]] = []
    for _ in range(args.pairs):
        if args.before is not None:
            plan.append(("before", args.before.resolve(), args.batch, w))
        plan.append(("after", after_tree, args.batch, w))
    for size in [int(s) for s in args.sweep.split(",") if s.strip()]:
        if args.before is not None and args.sweep_before:
            plan.append(("before", args.before.resolve(), size, w))
        plan.append(("after", after_tree, size, w))
    if args.tiny:
        if args.before is not None and args.sweep_before:
            plan.append(("before", args.before.resolve(), args.tiny, tiny))
        plan.append(("after", after_tree, args.tiny, tiny))

    commit = _commit(after_tree)
    print((f"driver cost on local[{args.local}]" if args.local else
           f"driver cost on a standalone cluster ({args.workers} one-core workers)") + " on "
          f"{os.cpu_count()} cores; "
          f"after = {after_tree} at {commit}" + (
              f", before = {args.before} at {_commit(args.before)}" if args.before else ""))
    print(f"workload: {w.description}; {args.fanout} deliveries per publish; backlog "
          f"{args.backlog:,} publishes ({args.tiny_backlog:,} for the tiny batches)"
          + ("; measured on a second backlog (--warm)" if args.warm else "")
          + "".join(f"; --set {s}" for s in args.set))
    sys.stdout.flush()
    base = Path(tempfile.mkdtemp(prefix="driver-cost-", dir=args.folder))
    results: list[RunResult] = []
    try:
        for i, (code, tree, batch, workload) in enumerate(plan):
            _log(f"run {i + 1}/{len(plan)}: {code} ({tree}), batches of {batch:,}")
            r = run_once(code, tree, batch, workload, args.fanout,
                         base / f"run{i + 1}-{code}-{batch}", args.timeout, args.sample, args.idle, args.warm,
                         tuple(args.set), args.workers, args.local)
            results.append(r)
            if i == 0:
                print(HEADER)
            print(run_line(r), flush=True)
            if r.ok and r.stages_s:
                print("    stages (s, summed over the batches): " + ", ".join(
                    f"{stage} {seconds:.2f}" for stage, seconds in r.stages_s.items()), flush=True)
            if args.threads and r.ok:
                print("    driver JVM threads (CPU s): " + ", ".join(
                    f"{name} {cpu:.2f}" for name, cpu in list(r.driver_jvm_threads.items())[:12]),
                    flush=True)
                print(f"    idle router ({args.idle:.0f}s): driver Python "
                      f"{r.idle_driver_python_per_s:.3f} CPU s/s; driver JVM threads (CPU s): "
                      + ", ".join(f"{name} {cpu:.2f}"
                                  for name, cpu in list(r.idle_jvm_threads.items())[:10]),
                      flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
        else:
            _log(f"runs kept in {base}")
    print()
    for line in summary(results) + capacity(results, args.target):
        print(line)
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "driver_s": r.driver_s,
                                          "executors_s": r.executors_s,
                                          "driver_per_million": r.driver_per_million,
                                          "driver_share": r.driver_share,
                                          "driver_per_batch": r.driver_per_batch}
                                         for r in results], indent=1))
    return 0 if all(r.ok for r in results) else 1


def _commit(tree: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "?"


if __name__ == "__main__":
    sys.exit(main())
