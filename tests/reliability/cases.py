"""The campaign's cases. Each returns a :class:`Result`: named checks (a value and
whether it passed, or ``None`` for a figure that is reported, not judged) and the
raw figures for the JSON file.

- :func:`kills`: SIGKILLs of the router at its kill points and at random moments.
- :func:`broker_kills`: the single broker SIGKILLed and restarted during the run.
- :func:`cluster`: a 3-broker KRaft cluster, one broker SIGKILLed mid-run and revived.
- :func:`fuzz`: bad publishes and bad subscription changes mixed into good traffic.
- :func:`soak`: a paced run at half the sustained rate, memory and folders sampled.

The month-three faults (issue 30), one case each:

- :func:`retention_gap`: publishes Kafka deleted (DeleteRecords) while the router was
  stopped: reported ``lost``, everything else delivered.
- :func:`deleted_topic`: a subscriber's delivery topic deleted while the router runs:
  recreated, nothing lost by the router.
- :func:`recreated_topic`: the publishes topic deleted and created again while the
  router runs: followed, the new topic's messages under ids of their own.
- :func:`restore`: the router's state folder copied while it routes, the router run on,
  stopped and restored from the copy.

Every case builds its own :class:`~.stage.Stage` in its own folder and tears it
down, whatever happens.
"""

from __future__ import annotations

import json
import random
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from schemas.records import MESSAGE_ID_HEADER, message_id
from streaming.process import pid_alive
from streaming.state.checkpoint import CheckpointLayout
from tests.reliability import fuzz as fuzzing
from tests.reliability.faulty_router import POINTS, arm
from tests.reliability.kafka_io import (
    REALTIME,
    CampaignError,
    Record,
    committed_offsets,
    create_topic,
    delete_records,
    delete_topic,
    end_offsets,
    read_topics,
    topic_names,
    topic_partitions,
)
from tests.reliability.ledger import Ledger
from tests.reliability.outputs import Rejections
from tests.reliability.stage import Churn, Stage
from tests.reliability.workload import Workload


@dataclass
class Options:
    """Sizes and durations; the defaults are the issue's (see docs/reliability.md)."""

    publishes: int = 1_000_000
    subscriptions: int = 3000
    subscribers: int = 300
    kills: int = 12
    broker_kills: int = 2
    down_s: float = 10.0
    fuzz_publishes: int = 10_000
    fuzz_changes: int = 10_000
    good_per_bad: float = 1.0
    soak_minutes: float = 30.0
    soak_rate: float = 0.0  # publishes/s; 0 = half the sustained rate, measured first
    soak_backlog: int = 200_000
    max_offsets: int = 20_000
    rate: float = 0.0  # publishes/s of the kill cases; 0 = spread over the case's kills
    seed: int = 1
    timeout_s: float = 7200.0
    kill_plan: tuple[tuple[str, str], ...] = ()  # (point, target) in order; () = KILL_PLAN shuffled
    kill_after_s: tuple[float, float] = (3.0, 15.0)  # random wait before each router kill
    publish_through_kills: bool = False  # kills: publish (at most `publishes`) until the last
    # kill is done, so every kill point meets publishes in flight however long restarts take
    broker_kill_after_s: tuple[float, float] = (10.0, 25.0)  # random wait before a broker kill
    bootstrap: str | None = None  # an existing Kafka (kills and fuzz only); None = start one
    executors: bool = False  # kills: every batch routed on the executors (their audit files;
    # realtime mode: the audit query's task writes them)
    mode: str = "microbatch"  # the router's streaming.mode; "realtime": REALTIME_CASES only
    # retention-gap: routed before the router stops; published while it is down (the
    # first GAP_SHARE of each partition's then deleted); published after the deletion
    gap_routed: int = 10_000
    gap_down: int = 40_000
    gap_after: int = 10_000
    # deleted-topic: publishes at topic_rate/s; the busiest subscriber's topic deleted
    # once topic_delete_at of them are acknowledged
    topic_publishes: int = 60_000
    topic_rate: float = 2000.0
    topic_delete_at: float = 1 / 3
    # recreated-topic: routed from the first publishes topic; published to the new one
    recreate_before: int = 10_000
    recreate_after: int = 10_000


@dataclass
class Check:
    name: str
    value: object
    ok: bool | None  # None: a figure, not a check


@dataclass
class Result:
    case: str
    checks: list[Check] = field(default_factory=list)
    figures: dict = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and all(c.ok is not False for c in self.checks)

    def check(self, name: str, value: object, ok: bool | None) -> None:
        self.checks.append(Check(name, value, ok))

    def value(self, name: str) -> object:
        """The value of the check named ``name``."""
        return next(c.value for c in self.checks if c.name == name)

    def failures(self) -> str:
        """The error and the failed checks, as one line (a test's assertion message)."""
        failed = [f"{c.name}: {c.value}" for c in self.checks if c.ok is False]
        return f"error={self.error}; failed checks: {failed}"

    def as_dict(self) -> dict:
        return {"case": self.case, "passed": self.passed, "seconds": round(self.seconds, 1),
                "error": self.error, "checks": [asdict(c) for c in self.checks],
                "figures": self.figures}


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _delivery_checks(result: Result, s: dict, what: str = "publishes", gone: int = 0) -> None:
    """The checks of every case; ``gone``: pairs missing in Kafka that the case accounts
    for itself (deliveries Kafka acknowledged into a topic later deleted)."""
    if s.get("lost"):
        result.check(f"{what} acknowledged by Kafka (good / bad / deleted unread)",
                     f"{s['good']:,} / {s['bad']:,} / {s['lost']:,}", None)
    else:
        result.check(f"{what} acknowledged by Kafka (good / bad)", f"{s['good']:,} / {s['bad']:,}",
                     None)
    result.check("expected (publish, subscriber) pairs", f"{s['pairs']:,}", None)
    if gone:
        result.check("pairs missing in Kafka, besides those gone with the deleted topic",
                     s["kafka_missing"] - gone, s["kafka_missing"] == gone)
    else:
        result.check("pairs missing in Kafka", s["kafka_missing"], s["kafka_missing"] == 0)
    result.check("duplicate deliveries in Kafka (at least once)", s["kafka_duplicates"], None)
    result.check("unexpected deliveries (wrong subscriber, exchange, or a bad publish)",
                 s["kafka_unexpected"], s["kafka_unexpected"] == 0)
    result.check("pairs without a deliveries row", s["audit_missing"], s["audit_missing"] == 0)
    result.check("pairs with more than one deliveries row", s["audit_repeated"],
                 s["audit_repeated"] == 0)
    result.check("deliveries rows of no expected pair", s["audit_unexpected"],
                 s["audit_unexpected"] == 0)
    result.check("publishes without a messages row", s["messages_missing"],
                 s["messages_missing"] == 0)
    result.check("publishes with more than one messages row", s["messages_repeated"],
                 s["messages_repeated"] == 0)
    result.check("messages rows with a wrong outcome or count", s["outcome_wrong"],
                 s["outcome_wrong"] == 0)


def _changelog_checks(result: Result, stage: Stage, rows: dict) -> None:
    c = stage.changelog_checks(rows)
    result.check("changelog records without a subscriptions row", c["changelog_without_row"],
                 c["changelog_without_row"] == 0)
    result.check("changelog records with more than one subscriptions row",
                 c["changelog_repeated_rows"], c["changelog_repeated_rows"] == 0)
    result.figures["changelog"] = c


@dataclass
class Ending:
    """A case's router stopped and its outputs read (:func:`_stop_and_read`)."""

    alive: bool  # the router was running when the case came to stop it
    starts: int  # how many times the router was started
    status: int  # its exit status after SIGTERM
    rejected: Rejections
    rows: dict  # the ``subscriptions`` rows by changelog position
    summary: dict  # the ledger's figures (Ledger.summary)


def _stop_and_read(stage: Stage, ledger: Ledger,
                   delivered: Iterable[tuple[str, str]] = ()) -> Ending:
    """Stop the router with SIGTERM, read every output into ``ledger``, count the
    (message id, subscriber) pairs of ``delivered`` (deliveries the case read itself)
    delivered too, and summarise the ledger."""
    alive, starts = stage.router.alive(), stage.router.starts
    status = stage.router.terminate()
    rejected, rows = stage.read_outputs(ledger)
    for mid, subscriber in delivered:
        ledger.delivered(mid, subscriber)
    return Ending(alive, starts, status, rejected, rows, ledger.summary())


def _ran_through(result: Result, end: Ending) -> None:
    """The check of the cases whose router must ride the fault out alone."""
    result.check("router stopped or restarted", f"alive={end.alive}, starts={end.starts}",
                 end.alive and end.starts == 1)


def _workload(o: Options) -> Workload:
    w = Workload.generate(o.subscriptions, o.subscribers, o.seed)
    wrong = w.check_oracle(200)
    if wrong:
        raise CampaignError(f"the workload's construction disagrees with the reference matcher "
                            f"on {wrong} of 200 publishes")
    return w


def _subscribe(stage: Stage, w: Workload) -> None:
    n = stage.write_changelog(("subscription", k, v) for k, v in w.changelog_records())
    _log(f"{n:,} subscriptions of {len(w.subscribers)} subscribers on the changelog")


# --- kills -------------------------------------------------------------------------------
EXECUTOR_SETTINGS = {
    "streaming.driver_route_max_publishes": "0",
    "streaming.executor_audit_files": "tasks",
    "spark.options.spark.python.daemon.module": "tests.reliability.worker_faults",
}
"""``Options.executors``: every batch routed on the executors, whose Python workers carry
the ``task-files`` kill point (:mod:`tests.reliability.worker_faults`)."""
REALTIME_EXECUTOR_SETTINGS = {"streaming.executor_audit_files": "tasks"}
"""``Options.executors`` in realtime mode (which routes in the JVM): the audit query's
Spark task writes each batch's audit files (:mod:`streaming.realtime.audit_batch`)."""
KILL_PLAN = (
    ("audit", "group"), ("catch-up", "group"), ("random", "jvm"), ("mid-audit", "python"),
    ("random", "group"), ("catch-up-read", "group"), ("after-audit", "group"),
    ("random", "python"), ("audit", "python"), ("catch-up", "python"), ("journaled", "group"),
    ("mid-audit", "group"), ("mid-compaction", "group"), ("mid-vacuum", "python"),
)
"""The kills, in plan order (then shuffled): every kill point, and random moments,
with each target (``group``: router + JVM + workers; ``python``: the driver alone, its
watchdog kills the JVM; ``jvm``: the Spark JVM alone)."""


def kills(folder: Path, o: Options) -> Result:
    """``o.kills`` SIGKILLs during an ``o.publishes`` run with subscription churn; the
    harness restarts the router after each (that is the operator's one action)."""
    result = Result("kills")
    rng = random.Random(o.seed)
    if o.kill_plan:
        plan = list(o.kill_plan)
    else:
        plan = [KILL_PLAN[i % len(KILL_PLAN)] for i in range(o.kills)]
        rng.shuffle(plan)
    w = _workload(o)
    executors = REALTIME_EXECUTOR_SETTINGS if o.mode == REALTIME else EXECUTOR_SETTINGS
    with Stage(folder, 1, executors if o.executors else None,
               bootstrap=o.bootstrap, mode=o.mode) as stage:
        stage.start(o.max_offsets)
        _subscribe(stage, w)
        stage.start_router()
        ledger = Ledger(stage.config.kafka.publishes_topic, stage.config.kafka.deliveries_topic_prefix)
        rate = o.rate or max(500.0, o.publishes / max(1, len(plan) * 30))
        _log(f"publishing {o.publishes:,} at {rate:,.0f}/s; {len(plan)} kills planned")
        kills_done = threading.Event() if o.publish_through_kills else None
        publisher = stage.publish_good(w, ledger, o.publishes, rate, o.seed, until=kills_done)
        churn = Churn(stage, w, 1.0, o.seed).start()
        done_kills: list[dict[str, Any]] = []
        outlived = leftover = stuck = 0
        for number, (point, target) in enumerate(plan, 1):
            time.sleep(rng.uniform(*o.kill_after_s))
            pending = stage.lag()
            jvms = stage.router.pids()["jvm"]
            fired = point
            if target == "worker":
                # A routing task's Python worker alone: the router lives on and routes
                # the batch again; there is nothing to restart.
                arm(stage.router.faults, point, target)
                if not stage.router.wait_worker_fault(120):
                    fired = "worker point not reached"
                _log(f"kill {number}/{len(plan)}: {fired}, {target}; {pending:,} publishes "
                     "pending")
                done_kills.append({"point": fired, "target": target, "pending": pending,
                                   "at": time.time()})
                continue
            if point != "random":
                arm(stage.router.faults, point, target)
                if not stage.router.wait_fault(120):
                    _log(f"kill {number}: point {point} not reached in 120s: killing now instead")
                    fired = "random (point not reached)"
                    stage.router.kill(target)
            else:
                stuck += not stage.router.kill(target)
            outlived += _jvm_outlived(jvms)
            leftover += stage.router.leftovers()
            _log(f"kill {number}/{len(plan)}: {fired}, {target}; {pending:,} publishes pending")
            done_kills.append({"point": fired, "target": target, "pending": pending,
                               "at": time.time()})
            stage.start_router()
        if kills_done is not None:
            kills_done.set()
        publisher.join(o.timeout_s)
        churn.stop()
        routed_s = stage.wait_routed(o.timeout_s)
        _log(f"all publishes routed {routed_s:.0f}s after the last kill's restart and publish")
        end = _stop_and_read(stage, ledger)
    s = end.summary
    result.check("kills (point, target)", ", ".join(f"{k['point']}/{k['target']}" for k in done_kills),
                 len(done_kills) == len(plan))
    result.check("kill points reached", sorted({k['point'] for k in done_kills} & set(POINTS)),
                 None)
    during = sum(1 for k in done_kills if k["pending"] > 0)
    result.check("kills with publishes pending (during the run)", f"{during} of {len(done_kills)}",
                 None)
    result.check("Spark JVMs that outlived their killed router (30 s)", outlived, outlived == 0)
    result.check("drivers still running 90 s after their JVM was killed", stuck, stuck == 0)
    result.check("processes of a killed router group left once its JVM ended (then killed)", leftover,
                 None)
    result.check("publishes the load driver could not write", publisher.failed, None)
    _delivery_checks(result, s)
    _changelog_checks(result, stage, end.rows)
    result.check("churn changes during the run", churn.count, None)
    result.check("router exit status after SIGTERM", end.status, end.status == 0)
    result.figures.update({"summary": s, "kills": done_kills, "rate": rate,
                           "router_starts": stage.router.starts})
    return result


def _jvm_outlived(jvms: list[int], wait: float = 30.0) -> int:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        alive = [p for p in jvms if pid_alive(p)]
        if not alive:
            return 0
        time.sleep(0.2)
    return len([p for p in jvms if pid_alive(p)])



# --- broker kills and the cluster --------------------------------------------------------
def broker_kills(folder: Path, o: Options, brokers: int = 1) -> Result:
    """The broker (or one of ``brokers``) SIGKILLed mid-run and started again, ``o.broker_kills``
    times (once for a cluster); the router is never touched."""
    name = "cluster" if brokers > 1 else "broker-kills"
    result = Result(name)
    rng = random.Random(o.seed + brokers)
    w = _workload(o)
    times = 1 if brokers > 1 else o.broker_kills
    extra = ({"kafka.replication_factor": "3", "kafka.min_insync_replicas": "2"}
             if brokers > 1 else {})
    with Stage(folder, brokers, extra, mode=o.mode) as stage:
        stage.start(o.max_offsets)
        _subscribe(stage, w)
        stage.start_router()
        ledger = Ledger(stage.config.kafka.publishes_topic, stage.config.kafka.deliveries_topic_prefix)
        rate = o.rate or max(500.0, o.publishes / ((times + 1) * 40))
        _log(f"publishing {o.publishes:,} at {rate:,.0f}/s; {times} broker kill(s) planned")
        publisher = stage.publish_good(w, ledger, o.publishes, rate, o.seed)
        outages = []
        for _ in range(times):
            time.sleep(rng.uniform(*o.broker_kill_after_s))
            node = rng.randrange(brokers)
            pending = stage.lag()
            kafka = stage.kafka
            assert kafka is not None  # a case of its own brokers (Stage without a bootstrap)
            kafka.kill(node)
            _log(f"broker {node + 1} SIGKILLed ({pending:,} publishes pending); down {o.down_s:.0f}s")
            time.sleep(o.down_s)
            up = kafka.revive(node)
            _log(f"broker {node + 1} back after {up:.0f}s of start-up")
            outages.append({"node": node + 1, "pending": pending, "down_s": o.down_s,
                            "restart_s": round(up, 1)})
        publisher.join(o.timeout_s)
        routed_s = stage.wait_routed(o.timeout_s)
        _log(f"all publishes routed {routed_s:.0f}s after the last publish")
        replication = stage.replication() if brokers > 1 else None
        end = _stop_and_read(stage, ledger)
    s = end.summary
    result.check("broker SIGKILLs (node: seconds down + restart)",
                 ", ".join(f"{x['node']}: {x['down_s']:.0f}+{x['restart_s']:.0f}s" for x in outages),
                 len(outages) == times)
    result.check("router restarts (operator actions)", end.starts - 1,
                 end.starts == 1 and end.alive)
    result.check("publishes the load driver could not write", publisher.failed,
                 publisher.failed == 0)
    _delivery_checks(result, s)
    _changelog_checks(result, stage, end.rows)
    if replication is not None:
        result.check("router topics: least replicas / min.insync.replicas",
                     f"{replication['min_replicas']} / {replication['min_insync']} "
                     f"({replication['topics']} topics)",
                     replication["min_replicas"] == 3 and replication["min_insync"] == 2)
    result.check("router exit status after SIGTERM", end.status, end.status == 0)
    result.figures.update({"summary": s, "outages": outages, "rate": rate,
                           "replication": replication})
    return result


def cluster(folder: Path, o: Options) -> Result:
    return broker_kills(folder, o, brokers=3)


# --- restore from an old state copy (issue 30) -------------------------------------------
RESTORED_LINE = "restored state:"
"""What the router logs once when it opens an older copy of its state (router/restore.py)."""


def restore(folder: Path, o: Options) -> Result:
    """``o.publishes`` in three parts: a fifth routed; then three fifths published at a
    pace, with subscription churn, while the state folder is copied (in docs/operations.md's
    order, the router routing) and the router runs on through them; the router stopped,
    its folder replaced by the copy, the last fifth published, the router started again.
    Every publish must reach Kafka at least once and be audited exactly once, every
    changelog record have one ``subscriptions`` row."""
    result = Result("restore")
    w = _workload(o)
    with Stage(folder, 1, bootstrap=o.bootstrap) as stage:
        stage.start(o.max_offsets)
        _subscribe(stage, w)
        stage.start_router()
        checkpoint = Path(stage.settings["streaming.checkpoint_dir"])
        ledger = Ledger(stage.config.kafka.publishes_topic, stage.config.kafka.deliveries_topic_prefix)
        first, during = o.publishes // 5, o.publishes * 3 // 5
        stage.publish_good(w, ledger, first, 0, o.seed).join(o.timeout_s)
        stage.wait_routed(o.timeout_s)
        rate = o.rate or max(500.0, during / 60)
        publisher = stage.publish_good(w, ledger, during, rate, o.seed + 31)
        churn = Churn(stage, w, 1.0, o.seed).start()
        batches = stage.router.batches
        while stage.router.batches < batches + 2 and not publisher.done.is_set():
            time.sleep(0.2)
        copy, t = folder / "state-copy", time.monotonic()
        vanished = _copy_state(checkpoint, copy)
        copy_s = time.monotonic() - t
        copied_at = stage.router.batches
        _log(f"state folder copied in {copy_s:.1f}s while routing ({vanished} files vanished "
             "meanwhile)")
        publisher.join(o.timeout_s)
        churn.stop()
        stage.wait_routed(o.timeout_s)
        ran_on = stage.router.batches - copied_at
        stopped = stage.router.terminate()
        shutil.move(checkpoint, folder / "state-replaced")
        shutil.copytree(copy, checkpoint)
        _log(f"the router ran {ran_on} batches on after the copy; stopped and restored from it")
        after = stage.publish_good(w, ledger, o.publishes - first - during, 0, o.seed + 32)
        after.join(o.timeout_s)
        restarted = time.monotonic()
        up_s = stage.start_router()
        stage.wait_routed(o.timeout_s)
        caught_up_s = time.monotonic() - restarted
        _log(f"restored router up in {up_s:.0f}s, every publish routed {caught_up_s:.0f}s "
             "after its start")
        end = _stop_and_read(stage, ledger)
        lines = _lines(stage.router.log_path, RESTORED_LINE)
    s = end.summary
    result.check("publishes: before the copy / routed on after it / after the restore",
                 f"{first:,} / {during:,} / {o.publishes - first - during:,}", None)
    result.check("state copy while routing: seconds, files vanished meanwhile",
                 f"{copy_s:.1f}, {vanished}", None)
    result.check("batches the router ran on after the copy", ran_on, ran_on >= 2)
    result.check("restore lines in the router's log (one per restored start)", len(lines),
                 len(lines) == 1)
    result.check("publishes the load driver could not write", publisher.failed + after.failed,
                 publisher.failed + after.failed == 0)
    _delivery_checks(result, s)
    _changelog_checks(result, stage, end.rows)
    result.check("churn changes during the run (after the copy)", churn.count, None)
    result.check("restored router: up (s) / every publish routed (s)",
                 f"{up_s:.0f} / {caught_up_s:.0f}", None)
    result.check("router exit status after SIGTERM (stop, end)", f"{stopped}, {end.status}",
                 stopped == 0 and end.status == 0 and end.alive)
    result.figures.update({"summary": s, "copy_s": round(copy_s, 2), "vanished": vanished,
                           "batches_after_copy": ran_on, "restore_lines": lines,
                           "restart_up_s": round(up_s, 1), "caught_up_s": round(caught_up_s, 1),
                           "rate": rate})
    return result


def _copy_state(checkpoint: Path, to: Path) -> int:
    """Copy a running router's state folder in docs/operations.md's order (Spark's commit
    log, its offset log, the rest of its checkpoint, the router's pins, the rest of its
    state); return how many files vanished between listing and copying."""
    vanished = 0

    def copy(source, target):
        nonlocal vanished
        try:
            return shutil.copy2(source, target)
        except FileNotFoundError:  # a journal entry committed, a pin pruned: not needed
            vanished += 1
            return target

    firsts = {"publishes": ("commits", "offsets"), "router": ("pins",)}
    for folder, names in firsts.items():
        for name in names:
            shutil.copytree(checkpoint / folder / name, to / folder / name, copy_function=copy)
        shutil.copytree(checkpoint / folder, to / folder, copy_function=copy, dirs_exist_ok=True,
                        ignore=lambda at, found, names=names, folder=folder: [
                            n for n in found if Path(at) == checkpoint / folder and n in names])
    return vanished


def _lines(log: Path, text: str) -> list[str]:
    """The lines of the router's log (every start) holding ``text``."""
    with log.open(errors="replace") as lines:
        return [line.strip() for line in lines if text in line]


# --- fuzz --------------------------------------------------------------------------------
def fuzz(folder: Path, o: Options) -> Result:
    """``o.fuzz_publishes`` bad publishes and ``o.fuzz_changes`` bad changes mixed into good
    traffic (``o.good_per_bad`` good publishes per bad one, a quarter of them hostile)."""
    result = Result("fuzz")
    rng = random.Random(o.seed)
    w = _workload(o)
    settings = {"kafka.max_delivery_bytes": str(fuzzing.MAX_DELIVERY_BYTES)}
    with Stage(folder, 1, settings, bootstrap=o.bootstrap, mode=o.mode) as stage:
        stage.start(o.max_offsets)
        before = topic_names(stage.config.kafka.client_settings)
        # Half the bad changes before the router starts, mixed with the good ones; the
        # other half while publishes flow.
        bad_changes = [fuzzing.bad_change(rng, i) for i in range(o.fuzz_changes)]
        first = bad_changes[: len(bad_changes) // 2]
        good = [("subscription", k, v) for k, v in w.changelog_records()]
        mixed = [(f"bad:{c}", k, v) for c, k, v in first] + good
        rng.shuffle(mixed)
        stage.write_changelog(mixed)
        _log(f"{len(good):,} subscriptions and {len(first):,} bad changes on the changelog")
        stage.start_router()
        expected_nonempty = [p for p in w.publishes(2000, o.seed + 3) if w.expected(p)]
        records: list[tuple[Record, tuple[str, ...] | None]] = []
        labels: list[str] = []
        n_good = int(o.fuzz_publishes * o.good_per_bad)
        goods = iter(w.publishes(n_good, o.seed + 5))
        kinds = ["bad"] * o.fuzz_publishes + ["good"] * n_good
        rng.shuffle(kinds)
        for kind in kinds:
            if kind == "bad":
                category, key, value, headers = fuzzing.bad_publish(rng, w, expected_nonempty)
                records.append(((key, value, headers), None))
                labels.append(f"bad:{category}")
                continue
            p = next(goods)
            if rng.random() < 0.25:
                category, key, value, headers = fuzzing.hostile_good_publish(rng, p)
                expected = () if category == fuzzing.WILDCARD_AMQP_KEY else w.expected(p)
                records.append(((key, value, headers), expected))
                labels.append(f"good:{category}")
            else:
                records.append(((p.key().encode(), b"ok", p.headers()), w.expected(p)))
                labels.append("good")
        ledger = Ledger(stage.config.kafka.publishes_topic, stage.config.kafka.deliveries_topic_prefix)
        categories: dict[str, str] = {}
        publisher = stage.publish_records(records, ledger, 2000.0, categories, labels)
        stage.write_changelog((f"bad:{c}", k, v) for c, k, v in bad_changes[len(first):])
        publisher.join(o.timeout_s)
        routed_s = stage.wait_routed(o.timeout_s)
        _log(f"all publishes routed {routed_s:.0f}s after the last publish")
        after = topic_names(stage.config.kafka.client_settings)
        end = _stop_and_read(stage, ledger)
        changelog = dict(stage.changelog)
    s, rejected, rows = end.summary, end.rejected, end.rows
    prefix = stage.config.kafka.deliveries_topic_prefix
    # Kafka's own internal topics (__consumer_offsets, created at the first consumer
    # group lookup) are the broker's, not the router's.
    outside = sorted(t for t in after - before if not t.startswith((prefix, "__")))
    # Bad changes: each in the rejected topic and in the subscriptions table, with a reason.
    topic = stage.config.kafka.subscriptions_topic
    per_category: dict[str, list[int]] = {}
    for (partition, offset), what in changelog.items():
        if not what.startswith("bad:"):
            continue
        mid = f"{topic}/{partition}/{offset}"
        in_kafka = bool(rejected.subscriptions.get(mid))
        found = rows.get((partition, offset), [])
        in_audit = any(change == "rejected" and reason for change, reason, _ in found)
        counts = per_category.setdefault(what[4:], [0, 0, 0])
        counts[0] += 1
        counts[1] += in_kafka
        counts[2] += in_audit
    good_changes = [p for p, what in changelog.items() if what == "subscription"]
    good_applied = sum(1 for p in good_changes if any(c == "upsert" for c, _, _ in rows.get(p, [])))
    bad_total = sum(c[0] for c in per_category.values())
    result.check("bad subscription changes acknowledged by Kafka", bad_total,
                 bad_total == o.fuzz_changes)
    result.check("bad changes in bitroute.rejected with a reason",
                 f"{sum(c[1] for c in per_category.values()):,} of {bad_total:,}",
                 all(c[1] == c[0] for c in per_category.values()))
    result.check("bad changes in the subscriptions table (rejected, with a reason)",
                 f"{sum(c[2] for c in per_category.values()):,} of {bad_total:,}",
                 all(c[2] == c[0] for c in per_category.values()))
    result.check("good subscriptions applied (upsert rows)", f"{good_applied:,} of {len(good_changes):,}",
                 good_applied == len(good_changes))
    bad_ids = [mid for mid, label in categories.items() if label.startswith("bad")]
    bad_in_kafka = sum(1 for mid in bad_ids if rejected.publishes.get(mid))
    result.check("bad publishes in bitroute.rejected with a reason",
                 f"{bad_in_kafka:,} of {len(bad_ids):,}", bad_in_kafka == len(bad_ids) == o.fuzz_publishes)
    result.check("good publishes in bitroute.rejected", s["good_rejected_in_kafka"],
                 s["good_rejected_in_kafka"] == 0)
    result.check("deliveries still carrying a forged bitroute.message_id",
                 s["kafka_forged_headers_kept"], s["kafka_forged_headers_kept"] == 0)
    _delivery_checks(result, s)
    _ran_through(result, end)
    result.check("topics created outside the delivery namespace", outside[:5] or 0, not outside)
    result.check("router exit status after SIGTERM", end.status, end.status == 0)
    publish_categories = _by_category(categories, ledger, rejected)
    result.figures.update({"summary": s, "bad_changes_by_category": per_category,
                           "publishes_by_category": publish_categories,
                           "topics_outside_namespace": outside})
    return result


def _by_category(categories: dict[str, str], ledger: Ledger, rejected) -> dict:
    out: dict[str, dict] = {}
    for mid, label in categories.items():
        entry = out.setdefault(label, {"published": 0, "rejected_in_kafka": 0})
        entry["published"] += 1
        entry["rejected_in_kafka"] += bool(rejected.publishes.get(mid))
    return out


# --- soak --------------------------------------------------------------------------------
def soak(folder: Path, o: Options) -> Result:
    """Half the sustained rate for ``o.soak_minutes``: memory of the driver, the JVM and
    the Python workers, and the size of the state folders, sampled every 10 s."""
    result = Result("soak")
    w = _workload(o)
    with Stage(folder, 1) as stage:
        stage.start(o.max_offsets)
        _subscribe(stage, w)
        stage.start_router()
        checkpoint = Path(stage.settings["streaming.checkpoint_dir"])
        ledger = Ledger(stage.config.kafka.publishes_topic, stage.config.kafka.deliveries_topic_prefix)
        sustained = None
        if o.soak_rate:
            rate = o.soak_rate
        else:
            t = time.monotonic()
            publisher = stage.publish_good(w, ledger, o.soak_backlog, 0, o.seed + 11)
            publisher.join(o.timeout_s)
            stage.wait_routed(o.timeout_s)
            sustained = o.soak_backlog / (time.monotonic() - t)
            rate = sustained / 2
            _log(f"sustained rate: {sustained:,.0f} publishes/s ({o.soak_backlog:,} in "
                 f"{time.monotonic() - t:.0f}s); soaking at {rate:,.0f}/s")
        n = int(rate * o.soak_minutes * 60)
        publisher = stage.publish_good(w, ledger, n, rate, o.seed + 12)
        samples = []
        t0 = time.monotonic()
        while not publisher.done.is_set() and stage.router.alive():
            pids = stage.router.pids()
            samples.append({"t": time.monotonic() - t0,
                            **{f"{role}_mb": sum(_rss(p) for p in ps) / 2**20
                               for role, ps in pids.items()},
                            **_folders(checkpoint)})
            publisher.done.wait(10)
        publisher.join(o.timeout_s)
        stage.wait_routed(o.timeout_s)
        end = _stop_and_read(stage, ledger)
    s = end.summary
    result.check("sustained rate (publishes/s), soak rate", f"{sustained or 0:,.0f}, {rate:,.0f}", None)
    result.check("soak duration (min), publishes", f"{o.soak_minutes:g}, {n:,}", None)
    slopes = _slopes(samples)
    for role in ("driver", "jvm", "workers"):
        sl = slopes.get(f"{role}_mb")
        if sl is None:
            result.check(f"{role} RSS", "no samples", False)
            continue
        # Flat: the fitted growth over the second half is within 5% of the mean or 32 MB.
        growth = sl["slope_per_min"] * sl["minutes"]
        ok = growth <= max(32.0, 0.05 * sl["mean"])
        result.check(f"{role} RSS slope, second half (MB/min; mean MB)",
                     f"{sl['slope_per_min']:+.2f} ({sl['mean']:,.0f})", ok)
    for folder_name in ("pins_files", "snapshot_files", "offsets_files", "commits_files"):
        values = [x[folder_name] for x in samples]
        if values:
            half = values[len(values) // 2:]
            result.check(f"{folder_name.replace('_', ' ')}: second half min..max (end)",
                         f"{min(half)}..{max(half)} ({values[-1]})",
                         max(half) <= _RETENTION[folder_name])
    sizes = [x["checkpoint_mb"] for x in samples]
    if sizes:
        half = sizes[len(sizes) // 2:]
        result.check("checkpoint folder MB: second half first -> last",
                     f"{half[0]:.1f} -> {half[-1]:.1f}", half[-1] - half[0] <= 5.0)
    _delivery_checks(result, s)
    result.check("router exit status after SIGTERM", end.status, end.status == 0)
    result.figures.update({"summary": s, "samples": samples, "slopes": slopes, "rate": rate,
                           "sustained": sustained})
    return result


_RETENTION = {"pins_files": 16 + 2, "snapshot_files": 3 * (16 + 2),
              "offsets_files": 100 + 5, "commits_files": 100 + 5}
"""Upper bounds of the state folders' file counts: PINS_KEPT pins (and their snapshots,
three files each: changes, meta, snapshot; plus the latest), and Spark's
spark.sql.streaming.minBatchesToRetain (100)."""


def _rss(pid: int) -> int:
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return 0  # ended between the listing and the reading


def _folders(checkpoint: Path) -> dict:
    layout = CheckpointLayout.of(checkpoint)

    def count(path: Path) -> int:
        try:
            return sum(1 for p in path.iterdir() if not p.name.startswith("."))
        except FileNotFoundError:
            return 0

    total = 0
    for p in checkpoint.rglob("*"):
        try:
            if p.is_file():
                total += p.stat().st_size
        except OSError:
            pass
    return {"checkpoint_mb": total / 2**20,
            "pins_files": count(layout.pins),
            "snapshot_files": count(layout.snapshots),
            "offsets_files": count(layout.offsets),
            "commits_files": count(layout.commits)}


def _slopes(samples: list[dict]) -> dict:
    """Least-squares slope (per minute) of each numeric series over the second half."""
    out: dict[str, dict[str, float]] = {}
    half = samples[len(samples) // 2:]
    if len(half) < 3:
        return out
    t = np.array([x["t"] for x in half]) / 60.0
    for key in half[0]:
        if key == "t":
            continue
        y = np.array([x[key] for x in half], dtype=float)
        slope = float(np.polyfit(t, y, 1)[0])
        out[key] = {"slope_per_min": slope, "mean": float(y.mean()), "minutes": float(t[-1] - t[0])}
    return out


# --- retention gap (issue 30) --------------------------------------------------------------
GAP_SHARE = 3 / 4
"""The share of each partition's publishes written while the router is down that the
retention-gap case deletes (the rest of them, and all later ones, must be delivered)."""


def retention_gap(folder: Path, o: Options) -> Result:
    """``o.gap_routed`` publishes routed; the router stopped; ``o.gap_down`` published,
    the first ``GAP_SHARE`` of them in each partition deleted with Kafka's DeleteRecords
    (what retention does to a router down longer than it), ``o.gap_after`` more published;
    the router restarted. Every deleted publish must be covered by exactly one ``lost``
    row of the audit, every other one delivered and audited exactly once."""
    result = Result("retention-gap")
    w = _workload(o)
    with Stage(folder, 1, bootstrap=o.bootstrap) as stage:
        stage.start(o.max_offsets)
        _subscribe(stage, w)
        stage.start_router()
        k = stage.config.kafka
        topic, checkpoint = k.publishes_topic, Path(stage.settings["streaming.checkpoint_dir"])
        ledger = Ledger(topic, k.deliveries_topic_prefix)
        stage.publish_good(w, ledger, o.gap_routed, 0, o.seed).join(o.timeout_s)
        stage.wait_routed(o.timeout_s)
        stopped = stage.router.terminate()
        read_to = committed_offsets(checkpoint)
        down = stage.publish_good(w, ledger, o.gap_down, 0, o.seed + 21)
        down.join(o.timeout_s)
        ends = {p: end for (_, p), end in end_offsets(k.client_settings, [topic]).items()}
        cut = {p: read_to.get(p, 0) + int((end - read_to.get(p, 0)) * GAP_SHARE)
               for p, end in ends.items()}
        delete_records(k.client_settings, topic, cut)
        deleted = sum(ledger.lose(message_id(topic, p, offset))
                      for p, end in cut.items() for offset in range(read_to.get(p, 0), end))
        _log(f"router stopped at {read_to}; {o.gap_down:,} published, {deleted:,} of them "
             f"deleted (DeleteRecords before {cut})")
        after = stage.publish_good(w, ledger, o.gap_after, 0, o.seed + 22)
        after.join(o.timeout_s)
        restarted = time.monotonic()
        up_s = stage.start_router()
        routed_s = stage.wait_routed(o.timeout_s)
        resume_s = time.monotonic() - restarted
        _log(f"router back in {up_s:.0f}s, every publish Kafka keeps routed {resume_s:.0f}s after "
             "the restart")
        end = _stop_and_read(stage, ledger)
        gap_lines = stage.router.log_lines("were deleted by Kafka (retention or DeleteRecords)")
        reported_in_batches = stage.router.lost
    s = end.summary
    failed = down.failed + after.failed
    result.check("publishes deleted unread (DeleteRecords while the router was down)",
                 f"{s['lost']:,}", s["lost"] == deleted > 0)
    result.check("deleted publishes reported lost (one lost row covering each)",
                 f"{s['lost_reported']:,}", s["lost_reported"] == s["lost"])
    result.check("deleted publishes without a lost row", s["lost_unreported"],
                 s["lost_unreported"] == 0)
    result.check("deleted publishes in more than one lost row", s["lost_repeated"],
                 s["lost_repeated"] == 0)
    # A row per partition and batch: a batch bounded by max_offsets_per_trigger that ends
    # before the earliest offset Kafka keeps records its part of the gap, the next the rest.
    result.check("lost rows (one per partition range a batch met) / wrong ones",
                 f"{s['lost_rows']} / {s['lost_rows_wrong']}",
                 s["lost_rows_wrong"] == 0 and s["lost_rows"] > 0)
    result.check("lost in the batch lines (bitroute run)", f"{reported_in_batches:,}",
                 reported_in_batches == s["lost"])
    result.check("gap lines in the router's log", gap_lines, gap_lines >= 1)
    result.check("publishes the load driver could not write", failed, failed == 0)
    _delivery_checks(result, s)
    _changelog_checks(result, stage, end.rows)
    result.check("router restart: up (s) / every publish Kafka keeps routed (s)",
                 f"{up_s:.0f} / {resume_s:.0f}", None)
    result.check("router exit status after SIGTERM (stop, end)", f"{stopped}, {end.status}",
                 stopped == 0 and end.status == 0 and end.alive)
    result.figures.update({"summary": s, "deleted_before": cut, "read_to": read_to,
                           "deleted": deleted, "restart_up_s": round(up_s, 1),
                           "resume_s": round(resume_s, 1), "routed_after_restart_s": round(routed_s, 1),
                           "gap_lines": gap_lines})
    return result


# --- deleted delivery topic (issue 30) --------------------------------------------------------
RECREATED_LINE = "did not exist (deleted while subscriptions feed it): created it again"
"""What the router logs once when it recreates a delivery topic (router/batch/routing.py)."""
TOPIC_PARTITIONS = 2
WARM_UP = 500
"""Publishes routed before the paced ones of the deleted-topic case."""
"""``kafka.delivery_partitions`` of the deleted-topic case: a topic the broker
auto-created instead of the router would have the broker's default, 1."""


def deleted_topic(folder: Path, o: Options) -> Result:
    """``o.topic_publishes`` publishes at ``o.topic_rate``/s; once ``o.topic_delete_at``
    of them are acknowledged, the delivery topic of the busiest subscriber is read to
    its end (the copy) and deleted, as an administrator would, while the router routes.

    What the case asserts, precisely: deliveries Kafka acknowledged into the topic
    before it was deleted are gone with it and are not the router's to lose; the
    router must lose nothing else. So every (publish, subscriber) pair is in Kafka
    (the copy, the recreated topic, the other subscribers' topics) except the victim's
    pairs of publishes written before the deletion completed that are not in the copy
    (the window between the copy and the deletion: counted, reported); each of those
    has its ``deliveries`` audit row, as every pair must (the router was told Kafka
    had it). Every victim pair of a publish written after the deletion completed is in
    the recreated topic; no publish is rejected; the recreated topic has the layout's
    partitions; the router never stops."""
    result = Result("deleted-topic")
    w = _workload(o)
    sample = Counter(s for p in w.publishes(2000, o.seed + 31) for s in w.expected(p))
    victim = sample.most_common(1)[0][0]
    settings = {"kafka.delivery_partitions": str(TOPIC_PARTITIONS)}
    with Stage(folder, 1, settings, bootstrap=o.bootstrap) as stage:
        stage.start(o.max_offsets)
        _subscribe(stage, w)
        stage.start_router()
        k = stage.config.kafka
        topic = k.layout.topic(victim)
        ledger = Ledger(k.publishes_topic, k.deliveries_topic_prefix)
        # A warm router first (its first batches pay Spark's and the workers' start), so
        # that the deletion meets steady routing.
        stage.publish_good(w, ledger, WARM_UP, 0, o.seed + 31).join(o.timeout_s)
        stage.wait_routed(o.timeout_s)
        publisher = stage.publish_good(w, ledger, o.topic_publishes, o.topic_rate, o.seed + 32)
        due = int(o.topic_publishes * o.topic_delete_at)
        checkpoint = Path(stage.settings["streaming.checkpoint_dir"])
        deadline = time.monotonic() + o.timeout_s
        # The deletion comes while routing is under way: due publishes acknowledged, some
        # batches committed and deliveries in the victim's topic.
        while publisher.acked < due or not sum(committed_offsets(checkpoint).values()) or not sum(
                end_offsets(k.client_settings, [topic]).values()):
            if time.monotonic() > deadline or publisher.done.is_set():
                raise CampaignError("the router was not routing into the victim's topic while "
                                    "publishes flowed; raise --topic-publishes")
            time.sleep(0.05)
        # The window: a victim delivery can be in the deleted topic and not in the copy
        # only if its publish was not yet committed by the router when the copy began
        # (a batch commits after Kafka acknowledged its deliveries) and was written
        # before the deletion completed.
        committed = committed_offsets(checkpoint)
        copy: list[str] = []
        read_topics(k.client_settings, [topic], lambda m: copy.append(
            (dict(m.headers() or []).get(MESSAGE_ID_HEADER) or b"").decode()), 120)
        t = time.monotonic()
        delete_topic(k.client_settings, topic)
        deleted_s = time.monotonic() - t
        published_before = {p: end for (_, p), end in end_offsets(
            k.client_settings, [k.publishes_topic]).items()}
        _log(f"{topic} ({victim}) deleted in {deleted_s:.1f}s with {len(copy):,} deliveries "
             f"read before; publishes written by then: {published_before}")
        deleted_at = time.monotonic()
        while topic_partitions(k.client_settings, topic) == 0 or not any(
                end for end in end_offsets(k.client_settings, [topic]).values()):
            if time.monotonic() - deleted_at > o.timeout_s or not stage.router.alive():
                raise CampaignError(f"{topic} was not recreated with a delivery in it")
            time.sleep(0.1)
        recovery_s = time.monotonic() - deleted_at
        _log(f"{topic} recreated with a delivery in it {recovery_s:.1f}s after its deletion")
        publisher.join(o.timeout_s)
        stage.wait_routed(o.timeout_s)
        partitions = topic_partitions(k.client_settings, topic)
        end = _stop_and_read(stage, ledger, ((mid, victim) for mid in copy))
        recreated_lines = stage.router.log_lines(RECREATED_LINE)
    s = end.summary
    missing = ledger.missing(victim)
    in_window = [m for m in missing
                 if committed.get(_offset(m)[0], 0) <= _offset(m)[1]
                 < published_before.get(_offset(m)[0], 0)]
    window = sum(end - committed.get(p, 0) for p, end in published_before.items())
    result.check("subscriber whose topic was deleted; deliveries read before the deletion",
                 f"{victim}; {len(copy):,}", len(copy) > 0)
    result.check("publishes in the window (not yet routed when the copy began, written "
                 "before the deletion completed)", f"{window:,}", None)
    result.check("victim deliveries gone with the deleted topic (of window publishes, "
                 "not in the copy)", len(in_window), None)
    result.check("victim deliveries lost by the router (missing outside the window)",
                 len(missing) - len(in_window), len(missing) == len(in_window))
    result.check("deletion to a delivery in the recreated topic (s)", f"{recovery_s:.1f}", None)
    result.check("recreated topic's partitions (the layout's)", partitions,
                 partitions == TOPIC_PARTITIONS)
    result.check("recreation lines in the router's log", recreated_lines, recreated_lines >= 1)
    result.check("publishes the load driver could not write", publisher.failed,
                 publisher.failed == 0)
    result.check("publishes rejected", f"{len(end.rejected.publishes):,}", not end.rejected.publishes)
    _delivery_checks(result, s, gone=len(in_window))
    _changelog_checks(result, stage, end.rows)
    _ran_through(result, end)
    result.check("router exit status after SIGTERM", end.status, end.status == 0)
    result.figures.update({"summary": s, "victim": victim, "copy": len(copy),
                           "gone_with_topic": len(in_window), "lost_by_router":
                           len(missing) - len(in_window), "recovery_s": round(recovery_s, 1),
                           "published_before_deletion": published_before,
                           "committed_before_copy": committed, "window": window,
                           "recreated_lines": recreated_lines})
    return result


def _offset(mid: str) -> tuple[int, int]:
    """(partition, offset) of a message id."""
    head, _, offset = mid.rpartition("/")
    return int(head.rpartition("/")[2]), int(offset)


# --- recreated publishes topic (issue 30) -------------------------------------------------------
RECREATED_TOPIC_LINE = "was deleted and created again (topic id"


def recreated_topic(folder: Path, o: Options) -> Result:
    """``o.recreate_before`` publishes routed by a running router; the publishes topic
    deleted and created again (same partitions) under it, as an administrator would;
    ``o.recreate_after`` published to the new topic. The router must follow the new topic
    without a restart: every publish of both topics delivered and audited exactly once,
    the new topic's under ids of its own (``<topic>~1/<partition>/<offset>``, none equal
    to an old one), and one line saying so."""
    result = Result("recreated-topic")
    w = _workload(o)
    with Stage(folder, 1, bootstrap=o.bootstrap) as stage:
        stage.start(o.max_offsets)
        _subscribe(stage, w)
        stage.start_router()
        k = stage.config.kafka
        topic = k.publishes_topic
        ledger = Ledger(topic, k.deliveries_topic_prefix)
        stage.publish_good(w, ledger, o.recreate_before, 0, o.seed + 41).join(o.timeout_s)
        stage.wait_routed(o.timeout_s)
        partitions = topic_partitions(k.client_settings, topic)
        t = time.monotonic()
        delete_topic(k.client_settings, topic)
        create_topic(k.client_settings, topic, partitions)
        recreate_s = time.monotonic() - t
        _log(f"{topic} deleted and created again with {partitions} partitions in "
             f"{recreate_s:.1f}s")
        t = time.monotonic()
        after = stage.publish_good(w, ledger, o.recreate_after, 0, o.seed + 42, incarnation=1)
        after.join(o.timeout_s)
        stage.wait_routed(o.timeout_s)
        follow_s = time.monotonic() - t
        _log(f"the new topic's {o.recreate_after:,} publishes routed {follow_s:.0f}s after the "
             "recreation")
        end = _stop_and_read(stage, ledger)
        lines = stage.router.log_lines(RECREATED_TOPIC_LINE)
    s = end.summary
    result.check("publishes of the first topic / of the new one (distinct ids)",
                 f"{o.recreate_before:,} / {o.recreate_after:,}",
                 s["publishes"] == o.recreate_before + o.recreate_after)
    result.check("recreation lines in the router's log", lines, lines >= 1)
    result.check("recreation to every new publish routed (s)", f"{follow_s:.0f}", None)
    result.check("publishes the load driver could not write", after.failed, after.failed == 0)
    result.check("publishes rejected", f"{len(end.rejected.publishes):,}", not end.rejected.publishes)
    _delivery_checks(result, s)
    _changelog_checks(result, stage, end.rows)
    _ran_through(result, end)
    result.check("router exit status after SIGTERM", end.status, end.status == 0)
    result.figures.update({"summary": s, "recreate_s": round(recreate_s, 1),
                           "follow_s": round(follow_s, 1), "partitions": partitions,
                           "recreated_lines": lines})
    return result


REALTIME_CASES = ("kills", "broker-kills", "cluster", "fuzz")
"""The cases ``--mode realtime`` runs: the faults realtime mode must ride out (router
kills, broker kills) and bad input. The others are runbooks of micro-batch mode
(docs/operations.md, "Realtime mode"): a retention gap, a deleted delivery topic, a
recreated publishes topic and a restore; the soak measures micro-batch's batches."""

CASES = {
    "kills": kills,
    "broker-kills": broker_kills,
    "cluster": cluster,
    "fuzz": fuzz,
    "soak": soak,
    "retention-gap": retention_gap,
    "deleted-topic": deleted_topic,
    "recreated-topic": recreated_topic,
    "restore": restore,
}
"""Case name (``python -m tests.reliability <name>``) -> case; ``all`` runs them in this order."""


def dump(results: list[Result], path: Path, options: Options, command: str) -> None:
    path.write_text(json.dumps({"command": command, "options": asdict(options),
                                "results": [r.as_dict() for r in results]}, indent=1, default=str))
