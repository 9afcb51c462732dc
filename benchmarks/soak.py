"""``python -m benchmarks soak``: does the router's memory and state stay flat over time?

    python -m benchmarks soak [--minutes 60] [--rate R] [--warmup-minutes 5]
                              [--size 100k] [--interval 5] [--churn 5]
                              [--set section.key=value]... [--workdir DIR] [--keep] [--smoke]

Everything runs on loopback in a temporary folder (``--workdir`` to choose it,
``--keep`` to keep it): an embedded Kafka broker of its own, the devices
workload's subscriptions (``benchmarks/workload.py``, 100k by default)
written to the changelog, and the router (``bitroute run --json``,
:class:`benchmarks.harness.RouterRun`). Then:

1. the sustained rate, unless ``--rate`` is given: a backlog of ``--backlog``
   publishes drained by full batches (as ``python -m benchmarks e2e``
   measures it); the soak runs at half of it;
2. the soak: raw Kafka publishes (librdkafka, one producer process) paced at
   that rate for ``--minutes``. Every ``--interval`` seconds: the resident
   memory (RSS) of the Python driver, the Spark JVM and each Python worker
   (once a minute also the JVM's heap, from ``jstat -gc``);
   the batches run since the previous sample and their stages (catch_up,
   route, audit); the sizes and entry counts of every state folder (pins,
   snapshots, Spark's offsets and commits, status, the audit journal when
   there is one, each Delta table's data files and ``_delta_log`` entries).
   A progress line a minute. Every ``--churn`` seconds (0: never) one subscription
   change is written to the changelog, a subscribe and then its unsubscribe in turn,
   so that the subscriptions stay as many while the router rebuilds its state (in
   realtime mode the routing view and every executor's native tables) all along.
   Each sample also reads ``status.json``: the end-to-end latency p50/p99 of the
   latest publishes (publish timestamp to routed) and, in realtime mode, the view's
   version.

Both modes (``--set streaming.mode=realtime``): in realtime mode the routing runs in
long tasks inside the same local Spark JVM (its RSS and old generation include the
executors' matchers and their native tables), and a "batch" is one of the audit
query's batches over the routed records, so its cost per publish is the audit's
(the routing's own cost shows in the latency). Realtime mode needs a task slot per
publishes partition plus one: on a 2-core machine ``--set spark.master=local[4]``.

At the end it prints, per process, the slope of its RSS (MB/min, least
squares over the samples after ``--warmup-minutes``) with the fit's standard
error, against the issue's bound (1 MB/min); the per-batch cost in the first
and the last minute after warm-up; and each folder's count at the end and its
largest; the latency and the cost per publish, per minute, first and last minute
after warm-up; the subscription changes written. Samples go to ``<workdir>/soak.csv`` and everything to
``<workdir>/soak.json`` (written also when the run is interrupted), whose
paths are printed.

Every process started here is ended on exit (normal, error, Ctrl-C, SIGTERM):
the router (SIGTERM, then SIGKILL), the Spark JVM and Python workers it started
(SIGKILL if they outlive it), the load driver and the broker. Run by hand,
never in CI.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import workload
from benchmarks.e2e import bitroute_run, kafka_load, procstat
from benchmarks.workload import EXCHANGE
from streaming.state.checkpoint import CheckpointLayout

MB = 1 << 20
FLAT_MB_PER_MIN = 1.0
"""The issue's bound: each process within 1 MB/min of flat after warm-up."""
ROLES = ("driver", "jvm", "workers")
ROLE_NAMES = {"driver": "Python driver", "jvm": "Spark JVM", "workers": "Python workers"}
STAGES = ("catch_up", "route", "audit", "seconds")
"""The micro-batch stages reported first; realtime mode's audit batches report their own
(``await_checkpoint``, ``audit``): every stage found in the batches is reported."""
CHURN_PREFIX = "soak-churn-"


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


# --- state folders ---------------------------------------------------------------------

def _count(folder: Path, accept=lambda name: True) -> tuple[int, int]:
    """(entries, bytes) of the files under ``folder`` (recursively) whose name ``accept``s."""
    n = size = 0
    if not folder.is_dir():
        return 0, 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            if accept(name):
                n += 1
                try:
                    size += os.stat(os.path.join(root, name)).st_size
                except FileNotFoundError:
                    pass
    return n, size


def folder_stats(state: Path, warehouse: Path) -> dict[str, float]:
    """Entry counts (``*_n``) and sizes in MB (``*_mb``) of every state folder."""
    layout = CheckpointLayout.of(state)

    def visible(name: str) -> bool:  # skips temporary and crc files
        return not name.startswith(".")

    folders = {
        "pins": (layout.pins, visible),
        "snapshots": (layout.snapshots, visible),
        "audit_journal": (layout.audit_journal, visible),
        "spark_offsets": (layout.offsets, visible),
        "spark_commits": (layout.commits, visible),
        "spark_checkpoint": (layout.query, visible),
        "router_state": (layout.state, visible),
        # realtime mode's: each query's Spark checkpoint and the audit's journal
        "realtime_routing": (layout.realtime_routing, visible),
        "realtime_audit": (layout.realtime_audit, visible),
        "realtime_audit_journal": (layout.realtime_audit_journal, visible),
    }
    out: dict[str, float] = {}
    for name, (path, accept) in folders.items():
        n, size = _count(path, accept)
        out[f"{name}_n"], out[f"{name}_mb"] = n, size / MB
    status = layout.status_file
    out["status_mb"] = status.stat().st_size / MB if status.exists() else 0.0
    if warehouse.is_dir():
        for table in sorted(p for p in warehouse.iterdir() if p.is_dir()):
            log_n, log_size = _count(table / "_delta_log", visible)
            data_n = data_size = 0
            for root, dirs, files in os.walk(table):
                dirs[:] = [d for d in dirs if d != "_delta_log"]
                for name in files:
                    if name.endswith(".parquet") and not name.startswith("."):
                        data_n += 1
                        try:
                            data_size += os.stat(os.path.join(root, name)).st_size
                        except FileNotFoundError:
                            pass
            out[f"delta_{table.name}_files_n"], out[f"delta_{table.name}_files_mb"] = data_n, data_size / MB
            out[f"delta_{table.name}_log_n"], out[f"delta_{table.name}_log_mb"] = log_n, log_size / MB
    return out


RETENTION = {
    "pins_n": "16 pins (streaming.router.subscriptions.snapshots.PINS_KEPT)",
    "snapshots_n": "3 files per kept version (the latest and those the 16 pins name)",
    "spark_offsets_n": "about 100 (spark.sql.streaming.minBatchesToRetain) + temporaries",
    "spark_commits_n": "about 100 (spark.sql.streaming.minBatchesToRetain)",
    "status_mb": "one file, rewritten each batch",
    "audit_journal_n": "the batches not yet committed to Delta (audit.max_pending_batches)",
    "realtime_audit_journal_n": "the audit batches not yet committed to Delta (audit.max_pending_batches)",
}


def jvm_heap(pid: int) -> dict[str, float]:
    """The Spark JVM's heap from ``jstat -gc`` (MB): committed (young + old), old generation
    used, metaspace used, full GCs. Empty when jstat is missing or the JVM is gone."""
    try:
        out = subprocess.run(["jstat", "-gc", str(pid)], capture_output=True, text=True,
                             timeout=20).stdout.split("\n")
        values = dict(zip(out[0].split(), (float(v) for v in out[1].split()), strict=True))
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return {}

    def kb(*keys: str) -> float:
        return sum(values.get(k, 0.0) for k in keys) / 1024

    return {"jvm_heap_committed_mb": round(kb("S0C", "S1C", "EC", "OC"), 1),
            "jvm_old_used_mb": round(kb("OU"), 1), "jvm_metaspace_mb": round(kb("MU"), 1),
            "jvm_full_gcs": values.get("FGC", 0.0)}


# --- slopes ----------------------------------------------------------------------------

@dataclass
class Fit:
    slope: float  # MB per minute
    stderr: float  # standard error of the slope
    residual: float  # standard deviation of the residuals, MB
    first: float
    last: float
    mean: float
    n: int
    minutes: float


def fit(ts_min: list[float], ys: list[float]) -> Fit | None:
    """Least-squares line through (minutes, MB); None with fewer than 3 points."""
    n = len(ts_min)
    if n < 3:
        return None
    mx, my = sum(ts_min) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in ts_min)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(ts_min, ys, strict=True)) / sxx
    resid = [y - (my + slope * (x - mx)) for x, y in zip(ts_min, ys, strict=True)]
    s2 = sum(r * r for r in resid) / max(1, n - 2)
    return Fit(slope, math.sqrt(s2 / sxx), math.sqrt(s2), ys[0], ys[-1], my, n,
               ts_min[-1] - ts_min[0])


# --- subscription churn ----------------------------------------------------------------

class Churn:
    """One subscription change every ``every`` seconds, in a thread: a subscribe of
    ``soak-churn-<i>`` (an existing subscriber of the workload, a filter of its own),
    then its unsubscribe (a tombstone), in turn. ``changes`` counts the acknowledged ones."""

    def __init__(self, config, w: workload.Workload, every: float) -> None:
        import threading

        from streaming.kafka import clients as kafka

        self._topic = config.kafka.subscriptions_topic
        self._producer = kafka.producer(config.kafka.client_settings, {"linger.ms": 0})
        self._subscriber = w.subs[0][1]
        self._every = every
        self._stop = threading.Event()
        self.changes = 0
        self.failures: list[str] = []
        self._thread = threading.Thread(target=self._run, name="soak-churn", daemon=True)

    def start(self) -> Churn:
        if self._every > 0:
            self._thread.start()
        return self

    def _run(self) -> None:
        i = 0
        while not self._stop.wait(self._every):
            key = f"{CHURN_PREFIX}{i // 2}".encode()
            value = (workload.changelog_value(EXCHANGE, self._subscriber, f"soak/churn/{i // 2}/#")
                     if i % 2 == 0 else None)
            self._producer.produce(self._topic, value=value, key=key,
                                   on_delivery=self._acked)
            self._producer.flush(30)
            i += 1

    def _acked(self, error, _message) -> None:
        if error is None:
            self.changes += 1
        elif len(self.failures) < 10:
            self.failures.append(str(error))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(60)


def status_figures(state: Path) -> dict:
    """The latency p50/p99 (ms) and, in realtime mode, the view version ``status.json``
    holds now (empty before the first batch, or while it is replaced)."""
    try:
        status = json.loads(CheckpointLayout.of(state).status_file.read_text())
    except (OSError, ValueError):
        return {}
    out = {}
    latency = status.get("latency_ms") or {}
    for k in ("p50", "p99"):
        if latency.get(k) is not None:
            out[f"latency_{k}_ms"] = round(float(latency[k]), 1)
    realtime = status.get("realtime") or {}
    if realtime.get("view_version") is not None:
        out["view_version"] = realtime["view_version"]
    out["snapshot_version"] = status.get("snapshot_version")
    return out


# --- the run ---------------------------------------------------------------------------

@dataclass
class Soak:
    args: argparse.Namespace
    workdir: Path
    samples: list[dict] = field(default_factory=list)
    batches: list[dict] = field(default_factory=list)
    result: dict = field(default_factory=dict)
    started_pids: set[int] = field(default_factory=set)
    churn: Churn | None = None


def _pids(env: bitroute_run.Env) -> dict[str, list[int]]:
    """Role -> pids. The JVM is the one the router reported: a process the JVM forks
    carries the JVM's command line until it execs, and would count its memory twice."""
    if env.running is None:
        return {r: [] for r in ROLES}
    pids = env.router.pids()
    pids["jvm"] = sorted(pids["jvm"])[:1]  # the first JVM: forks carry its command line
    return pids


def sample(env: bitroute_run.Env, soak: Soak, t0: float, n_probes: int, heap: bool) -> dict:
    pids = _pids(env)
    for ps in pids.values():
        soak.started_pids.update(ps)
    row: dict = {"t_s": round(time.time() - t0, 2), "time": time.strftime("%H:%M:%S")}
    for role in ROLES:
        rss = {p: procstat.rss_bytes(p) / MB for p in pids[role]}
        row[f"{role}_mb"] = round(sum(rss.values()), 2)
        row[f"{role}_processes"] = len(rss)
        if role == "workers":
            row["workers_each_mb"] = {str(p): round(v, 1) for p, v in rss.items()}
    if heap and pids["jvm"]:  # jstat is a JVM of its own: once a minute
        row.update(jvm_heap(pids["jvm"][0]))
    probes = env.router.batches[n_probes:]
    row["batches"] = len(probes)
    row["publishes"] = sum(b["rows"] for b in probes)
    state = Path(env.config.streaming.checkpoint_dir)
    row.update(status_figures(state))
    row["churn_changes"] = soak.churn.changes if soak.churn is not None else 0
    row.update({k: round(v, 3) for k, v in folder_stats(state, Path(env.config.delta.warehouse)).items()})
    return row


def stages_of(batches: list[dict]) -> list[str]:
    """The stages the batches report (micro-batch's first), ``seconds`` (the whole) last."""
    found = {k for b in batches for k in (b.get("stages") or {})}
    return ([k for k in STAGES if k in found] + sorted(found - set(STAGES)) + ["seconds"])


def _stage_means(batches: list[dict]) -> dict[str, float]:
    if not batches:
        return {}
    out = {k: statistics.median(b.get(k, 0.0) for b in batches) for k in stages_of(batches)}
    for k in STAGES:
        out.setdefault(k, 0.0)
    out["rows"] = statistics.mean(b["rows"] for b in batches)
    rows = sum(b["rows"] for b in batches)
    out["ms_per_publish"] = 1000 * sum(b.get("seconds", 0.0) for b in batches) / rows if rows else 0.0
    out["n"] = len(batches)
    return out


def run(soak: Soak) -> int:
    a = soak.args
    n = 100 if a.smoke else workload.SIZES[a.size]
    t = time.monotonic()
    w = workload.generate("devices", n, a.seed, a.publishes)
    matches, per_publish = workload.match_stats(w)
    _log(f"workload devices, {n:,} subscriptions: {w.description}; {per_publish:.2f} deliveries per publish "
         f"(generated in {time.monotonic() - t:.1f}s)")
    soak.result.update(
        {
            "mode": _mode(a.set),
            "churn_s": a.churn,
            "size": a.size,
            "subscriptions": n,
            "deliveries_per_publish": per_publish,
            "sets": a.set,
            "minutes": a.minutes,
            "warmup_minutes": a.warmup_minutes,
            "interval_s": a.interval,
            "loadavg_start": os.getloadavg(),
            "cores": os.cpu_count(),
            "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX"),
        }
    )
    env = bitroute_run.Env(soak.workdir / "bitroute", a.set)
    try:
        env.bring_up(w, _log)
        soak.started_pids.add((env.broker.pid() if env.broker is not None else None) or 0)
        rate = a.rate
        if not rate:
            sat = bitroute_run._saturate(env, w, a.backlog, 2, 1, _log)
            soak.result["sustained_publishes_per_s"] = sat.publishes_per_s
            rate = sat.publishes_per_s / 2
            _log(
                f"sustained {sat.publishes_per_s:,.0f} publishes/s ({a.backlog:,}-publish "
                f"backlog); soaking at half: {rate:,.0f}/s"
            )
        soak.result["rate"] = rate
        n_probes = len(env.router.batches)
        duration = a.minutes * 60
        procs, pout, start_at = kafka_load.start_publishers(
            env.config.kafka.bootstrap, env.config.kafka.publishes_topic, EXCHANGE, w, rate, duration, 1
        )
        soak.started_pids.update(p.pid for p in procs if p.pid is not None)
        time.sleep(max(0.0, start_at - time.time()))
        soak.churn = Churn(env.config, w, a.churn).start()
        t_start = time.time()
        _log(
            f"soak: {rate:,.0f} publishes/s for {a.minutes:g} min, sampling every "
            f"{a.interval:g}s, warm-up {a.warmup_minutes:g} min excluded from the slopes"
        )
        next_progress, next_heap = t_start + 60, t_start
        while time.time() < t_start + duration:
            if env.router.popen().poll() is not None:
                raise RuntimeError(
                    f"the router exited (status {env.router.popen().returncode}); see {env.router.log_path}"
                )
            heap = time.time() >= next_heap
            next_heap = next_heap + 60 if heap else next_heap
            row = sample(env, soak, t_start, n_probes, heap)
            soak.samples.append(row)
            if time.time() >= next_progress:
                next_progress += 60
                recent = [b for b in env.router.batches[n_probes:] if b["end"] >= time.time() - 60]
                m = _stage_means(recent)
                _log(
                    f"min {row['t_s'] / 60:4.1f}: RSS driver {row['driver_mb']:,.0f} MB, JVM "
                    f"{row['jvm_mb']:,.0f} MB, workers {row['workers_mb']:,.0f} MB "
                    f"({row['workers_processes']}); {row['batches']:,} batches, "
                    f"{row['publishes']:,} publishes; last minute per batch (median) "
                    + (f"{m['seconds']:.3f}s, audit {m['audit']:.3f}s, {m['rows']:.0f} publishes" if m else "no batch")
                    + f"; pins {row['pins_n']:.0f}, commits {row['spark_commits_n']:.0f}, "
                    f"deliveries table {row.get('delta_deliveries_files_n', 0):.0f} files / "
                    f"{row.get('delta_deliveries_log_n', 0):.0f} log entries; latency p50/p99 "
                    f"{row.get('latency_p50_ms', float('nan')):,.0f}/"
                    f"{row.get('latency_p99_ms', float('nan')):,.0f} ms; "
                    f"{row['churn_changes']} subscription changes"
                    + (f", view v{row['view_version']}" if "view_version" in row else "")
                )
            time.sleep(max(0.0, a.interval - (time.time() - t_start - row["t_s"])))
        soak.churn.stop()
        pub = kafka_load.join_publishers(procs, pout, timeout=300)
        sent0 = sum(b["rows"] for b in env.router.batches[:n_probes])
        env.router.wait_routed(sent0 + pub["sent"], timeout=300)
        soak.samples.append(sample(env, soak, t_start, n_probes, True))
        soak.batches = env.router.batches[n_probes:]
        soak.result["published"] = pub["sent"]
        soak.result["churn_changes"] = soak.churn.changes
        soak.result["churn_failures"] = soak.churn.failures
        soak.result["loadavg_end"] = os.getloadavg()
        return 0
    finally:
        _stop(env, soak)


def _mode(sets: list[str]) -> str:
    """``streaming.mode`` as the ``--set`` flags give it (the default otherwise)."""
    modes = [s.split("=", 1)[1] for s in sets if s.startswith("streaming.mode=")]
    return modes[-1] if modes else "microbatch"


def _stop(env: bitroute_run.Env, soak: Soak) -> None:
    """End every process this run started, whatever happened."""
    if soak.churn is not None:
        soak.churn.stop()
    try:
        if env.running is not None:
            pids = _pids(env)
            soak.started_pids.update(p for ps in pids.values() for p in ps)
            env.router.stop(timeout=60)
    finally:
        try:
            if env.broker is not None:
                env.broker.stop()
        finally:
            for pid in soak.started_pids:
                if pid and pid != os.getpid() and procstat.cmdline(pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass


# --- the report ------------------------------------------------------------------------


def report(soak: Soak) -> str:
    a, r = soak.args, soak.result
    warm_s = a.warmup_minutes * 60
    after = [s for s in soak.samples if s["t_s"] >= warm_s]
    lines = [
        f"Soak: devices {a.size} ({r.get('subscriptions', 0):,} subscriptions), "
        f"{r.get('rate', 0):,.0f} publishes/s for {a.minutes:g} min"
        + (
            f" (half the sustained {r['sustained_publishes_per_s']:,.0f}/s)"
            if r.get("sustained_publishes_per_s")
            else " (--rate)"
        )
        + f", {r.get('published', 0):,} publishes, {len(soak.batches):,} batches; "
        f"{r.get('cores')} cores, load average {r.get('loadavg_start', [0])[0]:.1f} at start, "
        f"{r.get('loadavg_end', [0])[0]:.1f} at end",
        f"mode {r.get('mode', _mode(a.set))}; {r.get('churn_changes', 0):,} subscription "
        f"changes (one every {a.churn:g}s)"
        + (f", failures: {r['churn_failures'][:2]}" if r.get("churn_failures") else ""),
        f"router settings: {' '.join(a.set) or '(defaults)'}"
        + (f"; MALLOC_ARENA_MAX={r['malloc_arena_max']}" if r.get("malloc_arena_max") else ""),
        "",
        f"RSS slope after {a.warmup_minutes:g} min of warm-up ({len(after)} samples, "
        f"least squares; bound {FLAT_MB_PER_MIN:g} MB/min):",
    ]
    fits = {}
    for role in ROLES:
        f = fit([s["t_s"] / 60 for s in after], [s[f"{role}_mb"] for s in after])
        fits[role] = f
        if f is None:
            lines.append(f"  {ROLE_NAMES[role]:<16} too few samples after the warm-up")
            continue
        ok = abs(f.slope) <= FLAT_MB_PER_MIN
        procs = max(s[f"{role}_processes"] for s in after)
        lines.append(
            f"  {ROLE_NAMES[role]:<16} {f.slope:+7.2f} MB/min (+/- {f.stderr:.2f}; residual "
            f"sd {f.residual:.1f} MB) {f.first:8,.0f} -> {f.last:8,.0f} MB over "
            f"{f.minutes:.1f} min, {procs} process(es): "
            f"{'flat' if ok else 'NOT FLAT'}"
        )
    soak.result["slopes"] = {k: (vars(v) if v else None) for k, v in fits.items()}
    heap = [s for s in after if "jvm_old_used_mb" in s]
    old = fit([s["t_s"] / 60 for s in heap], [s["jvm_old_used_mb"] for s in heap])  # None: < 3 points
    if old is not None:
        lines.append(
            f"  Spark JVM heap (jstat, each minute): committed {heap[0]['jvm_heap_committed_mb']:,.0f}"
            f" -> {heap[-1]['jvm_heap_committed_mb']:,.0f} MB, old generation used "
            f"{old.first:,.0f} -> {old.last:,.0f} MB ({old.slope:+.2f} MB/min), metaspace "
            f"{heap[-1]['jvm_metaspace_mb']:,.0f} MB, {heap[-1]['jvm_full_gcs']:.0f} full GCs "
            "(a JVM whose RSS grows while its committed heap grows is still sizing its heap)"
        )
    if soak.samples:
        s0 = soak.samples[0]
        lines.append(
            f"  (at the first sample, before warm-up: driver {s0['driver_mb']:,.0f} MB, "
            f"JVM {s0['jvm_mb']:,.0f} MB, workers {s0['workers_mb']:,.0f} MB)"
        )
    b = soak.batches
    if b:
        t_first = b[0]["end"]
        warm = [x for x in b if x["end"] >= t_first + warm_s]
        if warm:
            head = [x for x in warm if x["end"] < warm[0]["end"] + 60]
            tail = [x for x in warm if x["end"] >= warm[-1]["end"] - 60]
            h, t = _stage_means(head), _stage_means(tail)
            lines += [
                "",
                "Per batch (median), first and last minute after warm-up"
                + (" (realtime: the audit query's batches):" if r.get("mode") == "realtime" else ":"),
            ]
            for k in stages_of(warm):
                ratio = t[k] / h[k] if h.get(k) else float("nan")
                lines.append(
                    f"  {('whole batch' if k == 'seconds' else k):<12} {h[k]:7.3f}s -> {t[k]:7.3f}s ({ratio:.2f}x)"
                )
            lines.append(f"  publishes per batch {h['rows']:.0f} -> {t['rows']:.0f} ({h['n']} and {t['n']} batches)")
            ratio = t["ms_per_publish"] / h["ms_per_publish"] if h["ms_per_publish"] else float("nan")
            lines.append(
                f"  per publish  {h['ms_per_publish']:7.3f} ms -> {t['ms_per_publish']:7.3f} ms ({ratio:.2f}x)"
            )
            soak.result["per_batch"] = {"first_minute": h, "last_minute": t}
    lat = [s for s in after if "latency_p50_ms" in s]
    if lat:
        t_head, t_tail = lat[0]["t_s"] + 60, lat[-1]["t_s"] - 60
        head = [s for s in lat if s["t_s"] <= t_head]
        tail = [s for s in lat if s["t_s"] >= t_tail]

        def med(rows: list[dict], k: str) -> float:
            return statistics.median(s[k] for s in rows)

        lines += [
            "",
            "End-to-end latency (status.json: the latest publishes, publish to routed), "
            "median of the samples in the first and last minute after warm-up:",
            f"  p50 {med(head, 'latency_p50_ms'):,.0f} -> {med(tail, 'latency_p50_ms'):,.0f} ms, "
            f"p99 {med(head, 'latency_p99_ms'):,.0f} -> {med(tail, 'latency_p99_ms'):,.0f} ms",
        ]
        soak.result["latency"] = {
            "first_minute": {k: med(head, f"latency_{k}_ms") for k in ("p50", "p99")},
            "last_minute": {k: med(tail, f"latency_{k}_ms") for k in ("p50", "p99")},
        }
        versions = [s["view_version"] for s in after if s.get("view_version") is not None]
        if versions:
            lines.append(f"  routing view version {versions[0]} -> {versions[-1]} after warm-up")
    if soak.samples:
        last, mid = soak.samples[-1], soak.samples[len(soak.samples) // 2]
        lines += ["", "State folders at the end: entries, MB (largest entries during the run):"]
        bases = [k[:-2] for k in last if k.endswith("_n")]
        for base in bases:
            peak = max(s.get(f"{base}_n", 0) for s in soak.samples)
            note = f"  [retention: {RETENTION[base + '_n']}]" if base + "_n" in RETENTION else ""
            lines.append(
                f"  {base:<28} {last[f'{base}_n']:>9,.0f} {last.get(f'{base}_mb', 0):>10,.2f} MB ({peak:,.0f}){note}"
            )
        lines.append(
            f"  {'status.json':<28} {'1':>9} {last['status_mb']:>10,.3f} MB  [retention: {RETENTION['status_mb']}]"
        )
        grow = [b for b in bases if b.startswith("delta_") and last[f"{b}_n"] > 1.5 * max(1, mid.get(f"{b}_n", 0))]
        if grow:
            lines.append(
                "  growing with the number of batches: "
                + ", ".join(grow)
                + " (until the audit maintenance compacts and cleans them)"
            )
    return "\n".join(lines)


def write_outputs(soak: Soak) -> tuple[Path, Path]:
    csv_path, json_path = soak.workdir / "soak.csv", soak.workdir / "soak.json"
    if soak.samples:
        keys = [k for k in soak.samples[0] if k != "workers_each_mb"]
        for s in soak.samples:  # tables can appear after the first sample
            keys += [k for k in s if k not in keys and k != "workers_each_mb"]
        with csv_path.open("w", newline="") as f:
            wr = csv.DictWriter(f, keys, extrasaction="ignore")
            wr.writeheader()
            wr.writerows(soak.samples)
    json_path.write_text(
        json.dumps(
            {
                "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(soak.args).items()},
                "result": soak.result,
                "samples": soak.samples,
                "batches": soak.batches,
            },
            default=str,
        )
    )
    return csv_path, json_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks soak", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--minutes", type=float, default=60.0, help="soak length (default 60)")
    ap.add_argument(
        "--rate", type=float, default=0.0, help="publishes/s (default: half the sustained rate, measured first)"
    )
    ap.add_argument(
        "--backlog", type=int, default=200_000, help="publishes drained to measure the sustained rate (without --rate)"
    )
    ap.add_argument(
        "--warmup-minutes", type=float, default=5.0, help="samples before this are left out of the slopes (default 5)"
    )
    ap.add_argument("--size", choices=sorted(workload.SIZES), default="100k")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--publishes", type=int, default=200_000, help="distinct publishes generated (the load cycles through them)"
    )
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    ap.add_argument(
        "--churn",
        type=float,
        default=5.0,
        help="seconds between subscription changes (a subscribe, then its unsubscribe; default 5, 0: none)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="router configuration override (repeatable), as for bitroute run",
    )
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--smoke", action="store_true", help="toy size: 100 subscriptions, 6 s at 200 publishes/s")
    args = ap.parse_args(argv)
    if args.smoke:
        args.minutes, args.rate, args.warmup_minutes, args.interval = 0.1, 200.0, 0.0, 2.0
        args.publishes = 2000
        args.churn = min(args.churn, 1.0) if args.churn else 0.0
    signal.signal(signal.SIGTERM, _interrupt)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bitroute-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    soak = Soak(args, workdir)
    status = 1
    try:
        status = run(soak)
    except KeyboardInterrupt:
        _log("interrupted: every process started was stopped; the figures below are partial")
        status = 130
    except Exception as exc:  # noqa: BLE001 - report what was sampled, then fail
        _log(f"error: {exc}")
        status = 1
    print(report(soak), flush=True)
    csv_path, json_path = write_outputs(soak)
    _log(f"samples in {csv_path}, everything in {json_path}")
    if not args.keep and args.workdir is None:
        # The samples are worth keeping: only the broker's and router's state goes.
        shutil.rmtree(workdir / "bitroute", ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
