"""Benchmark of compiler/ (the routing index) against a trie and a naive scan.

Run by hand (CI runs it with --smoke):

    taskset -c 1 .venv/bin/python -m benchmarks compiler \
        [--sizes 10000,100000,1000000] [--profiles devices,fanout] [--seed 1] [--smoke]

For each profile (see workload.py, RANKED_PROFILES) and size N it builds three matchers over the
same N subscriptions -- bitroute (compiler.RoutingIndex -> Snapshot -> Matcher,
whose tables and per-topic work are the Rust kernel, bitroute_kernel),
a plain Python trie (trie.py) and the naive scan (compiler.reference) -- checks
on a sample that all three return the same deliveries (aborts if not), then
measures:

- build: CPU seconds from subscription records to a usable matcher (bitroute:
  RoutingIndex + upsert of every Subscription + snapshot() + Matcher(); trie:
  insert every filter; naive: upsert every Subscription);
- bytes/sub: serialised size / N (bitroute: Snapshot.to_bytes(); trie: the
  pickled (id, subscriber, filter) records, as unpickling a 1M-node trie is
  slower than rebuilding it; naive: the same records, which are all it
  holds), and load:
  CPU seconds from those bytes to a usable matcher (bitroute:
  Snapshot.from_bytes() + Matcher(); trie and naive: unpickle + build);
- cold: per-topic time of match() on distinct topics drawn uniformly from the
  topic space, one call each, on a fresh Matcher built from the loaded bytes
  (its topic cache is empty, so every call is a miss); median and p99 of
  wall-clock time per call, bitroute and trie interleaved topic by topic so
  that load from other processes hits both alike.  The naive scan is timed
  on as many of those topics as fit its time budget (at least 3), and its
  results on them are checked against the trie's;
- batch: publishes per CPU second of this process (pyarrow's threads
  included) over batches of 10k Zipf publishes, alternating implementations
  batch by batch.  bitroute through Matcher.match_columns, the call a routing
  task makes (streaming.router.batch.routing.plan_batch: de-duplication within the
  batch in the kernel, deliveries as an Arrow list<struct<subscriber,
  subscription_ids>> column; the columns are Python lists, as the task holds
  them); the trie through trie_match_frame (the same de-duplication and the
  same output built the same way).  "first" is the first batch on a fresh matcher, "steady" all batches on
  one matcher (the batch path keeps no cache across batches; the trie has
  none).  The naive scan is estimated from its cold mean
  times the distinct topics per batch when running it would exceed its budget
  (marked ~).

Ratios are speed-ups of bitroute (>1 means bitroute is better).  Progress goes
to stderr, the tables to stdout.  --cprofile DIR writes cProfile statistics
of bitroute's cold loop and of one batch to DIR.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pickle
import platform
import pstats
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from benchmarks import trie as trie_mod, workload

T0 = time.perf_counter()
WARM = 20  # topics matched before the cold loop (not timed, not in the cold set)
COMPILER_SOURCE = ""
NAIVE_MIN_TOPICS = 3  # the naive scan is timed on at least this many topics


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:8.1f}s] {msg}", file=sys.stderr, flush=True)


# -- adapter to compiler/ ---------------------------------------------------


class Bitroute:
    """Thin adapter so a renamed API only needs changing here."""

    def __init__(self) -> None:
        import compiler
        from compiler import Matcher, RoutingIndex, Snapshot, Subscription
        from compiler.reference import ReferenceMatcher

        self.compiler = compiler
        self.Matcher, self.RoutingIndex = Matcher, RoutingIndex
        self.Snapshot, self.Subscription = Snapshot, Subscription
        self.ReferenceMatcher = ReferenceMatcher
        self.Dialect = compiler.Dialect

    def dialect(self, name: str):
        D = self.Dialect
        for attempt in (lambda: D(name), lambda: D[name.upper()], lambda: getattr(D, name.upper())):
            try:
                return attempt()
            except (ValueError, KeyError, AttributeError):
                pass
        raise SystemExit(f"cannot map dialect {name!r} onto {D!r}")


def normalise(deliveries) -> dict[str, tuple[str, ...]]:
    """bitroute deliveries / trie groups -> {subscriber: sorted ids}."""
    if isinstance(deliveries, dict):
        return {s: tuple(sorted(ids)) for s, ids in deliveries.items()}
    out: dict[str, tuple[str, ...]] = {}
    for d in deliveries:
        if d.subscriber in out:
            raise SystemExit(f"MISMATCH: subscriber {d.subscriber!r} delivered twice: {deliveries!r}")
        out[d.subscriber] = tuple(sorted(d.subscription_ids))
    return out


def normalise_frame_row(value) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    if value is None:
        return out
    for item in value:
        s = item["subscriber"]
        if s in out:
            raise SystemExit(f"MISMATCH: subscriber {s!r} twice in one frame row")
        out[s] = tuple(sorted(item["subscription_ids"]))
    return out


# -- results ----------------------------------------------------------------


@dataclass
class Row:
    impl: str
    build_s: float = float("nan")
    bytes_per_sub: float = float("nan")
    load_s: float = float("nan")
    cold_median_us: float = float("nan")
    cold_p99_us: float = float("nan")
    cold_n: int = 0
    first_pps: float = float("nan")
    steady_pps: float = float("nan")
    batch_note: str = ""
    churn_per_s: float = float("nan")
    notes: list[str] = field(default_factory=list)


@dataclass
class Result:
    profile: str
    n: int
    description: str
    subscribers: int
    matches_per_topic: str
    deliveries_per_topic: str
    distinct_per_batch: str
    rows: dict[str, Row]


def measure_churn(br: Bitroute, wl, index, changes: int) -> tuple[float, str]:
    """Changes per CPU second applied to the built index one record at a time,
    as the changelog applies them (``upsert``/``remove``): a seeded mix of 40%
    replacements (an existing id gets another subscription's filter and
    subscriber), 30% removals and 30% new ids; then one ``snapshot()`` and
    ``Matcher()`` of the result, timed apart."""
    rng = random.Random(f"churn/{wl.profile}/{wl.n}")
    Sub, ex, subs = br.Subscription, wl.exchange, wl.subs
    stream = []
    for k in range(changes):
        r = rng.random()
        if r < 0.4:
            sid = subs[rng.randrange(len(subs))][0]
            _, subscriber, filt = subs[rng.randrange(len(subs))]
            stream.append(Sub(id=sid, exchange=ex, subscriber=subscriber, filter=filt))
        elif r < 0.7:
            stream.append(subs[rng.randrange(len(subs))][0])
        else:
            _, subscriber, filt = subs[rng.randrange(len(subs))]
            stream.append(Sub(id=f"churn{k}", exchange=ex, subscriber=subscriber, filter=filt))
    gc.collect()
    upsert, remove = index.upsert, index.remove
    t = time.process_time()
    for change in stream:
        if change.__class__ is str:
            remove(change)
        else:
            upsert(change)
    apply_s = time.process_time() - t
    t = time.process_time()
    br.Matcher(index.snapshot(2, {0: wl.n + changes}))
    rebuild_s = time.process_time() - t
    rate = changes / apply_s
    return rate, (f"churn: {changes:,} changes (40% replace, 30% remove, 30% add) in {apply_s:.2f}s, "
                  f"{rate:,.0f} changes/s; then snapshot() + Matcher() {rebuild_s:.2f}s")


def pctl(ns: list[int], q: float) -> float:
    return float(np.percentile(np.asarray(ns, dtype=np.float64), q)) / 1000.0


# -- one configuration ------------------------------------------------------


def columns(frame: pd.DataFrame) -> tuple[list, list, list]:
    """A batch as a routing task hands it to ``Matcher.match_columns``."""
    return (frame["message_id"].tolist(), frame["exchange"].tolist(),
            frame["routing_key"].tolist())


def make_frame(exchange: str, topics: list[str], start: int) -> pd.DataFrame:
    n = len(topics)
    return pd.DataFrame(
        {
            "message_id": [f"publishes/0/{start + i}" for i in range(n)],
            "exchange": [exchange] * n,
            "routing_key": topics,
            "headers": [None] * n,
        }
    )


def run_config(br: Bitroute, profile: str, n: int, args) -> Result:
    seed = args.seed
    log(f"{profile} N={n}: generating workload")
    wl = workload.RANKED_PROFILES[profile](n, seed)
    ex = wl.exchange
    rows = {k: Row(k) for k in ("bitroute", "trie", "naive")}
    rng = random.Random(f"topics/{profile}/{n}/{seed}")
    nprng = np.random.default_rng([seed, n, sorted(workload.RANKED_PROFILES).index(profile)])

    # ---- build: bitroute
    log(f"{profile} N={n}: building bitroute index")
    gc.collect()
    Sub = br.Subscription
    t = time.process_time()
    index = br.RoutingIndex({ex: br.dialect(wl.dialect)})
    upsert = index.upsert
    for sid, subscriber, filt in wl.subs:
        upsert(Sub(id=sid, exchange=ex, subscriber=subscriber, filter=filt))
    t_upsert = time.process_time() - t
    t = time.process_time()
    snap = index.snapshot(1, {0: n})
    t_snap = time.process_time() - t
    t = time.process_time()
    br.Matcher(snap)
    t_matcher = time.process_time() - t
    rows["bitroute"].build_s = t_upsert + t_snap + t_matcher
    rows["bitroute"].notes.append(f"build = upserts {t_upsert:.2f}s + snapshot() {t_snap:.2f}s + Matcher() "
                                  f"{t_matcher:.2f}s")
    log(f"  build {rows['bitroute'].build_s:.2f}s (upserts {t_upsert:.2f}s, snapshot {t_snap:.2f}s, Matcher "
        f"{t_matcher:.2f}s); serialising")
    t = time.process_time()
    blob = snap.to_bytes()
    to_bytes_s = time.process_time() - t
    rows["bitroute"].bytes_per_sub = len(blob) / n
    gc.collect()
    t = time.process_time()
    loaded = br.Snapshot.from_bytes(blob)
    t_from = time.process_time() - t
    t = time.process_time()
    br.Matcher(loaded)
    t_m2 = time.process_time() - t
    rows["bitroute"].load_s = t_from + t_m2
    rows["bitroute"].notes.append(f"to_bytes() {to_bytes_s:.2f}s; load = from_bytes() {t_from:.2f}s + Matcher() "
                                  f"{t_m2:.2f}s")
    log(f"  {len(blob)} bytes ({len(blob) / n:.1f}/sub), to_bytes {to_bytes_s:.2f}s, from_bytes {t_from:.2f}s, "
        f"Matcher {t_m2:.2f}s")
    churn_per_s, churn_note = measure_churn(br, wl, index, args.churn)
    rows["bitroute"].churn_per_s = churn_per_s
    rows["bitroute"].notes.append(churn_note)
    log(f"  {churn_note}")
    del blob, index, snap

    # ---- build: trie.  Pickling the trie's node objects was measured 3x
    # slower to load than rebuilding it, so a trie user ships the records:
    # bytes = the pickled (id, subscriber, filter) list, load = unpickling
    # it + building the trie.
    log(f"{profile} N={n}: building trie")
    gc.collect()
    tblob = pickle.dumps(wl.subs, protocol=pickle.HIGHEST_PROTOCOL)
    rows["trie"].bytes_per_sub = len(tblob) / n
    t = time.process_time()
    records = pickle.loads(tblob)
    t_unpickle = time.process_time() - t
    del tblob
    t = time.process_time()
    tr = trie_mod.build_trie(wl.dialect, records)
    rows["trie"].build_s = time.process_time() - t
    rows["trie"].load_s = t_unpickle + rows["trie"].build_s
    rows["trie"].notes.append(f"bytes = pickled records; load = unpickle {t_unpickle:.2f}s + build")
    del records
    log(f"  build {rows['trie'].build_s:.2f}s, {rows['trie'].bytes_per_sub:.1f} bytes/sub pickled records, load "
        f"{rows['trie'].load_s:.2f}s")

    # ---- build: naive
    log(f"{profile} N={n}: building naive scan")
    gc.collect()
    t = time.process_time()
    naive = br.ReferenceMatcher({ex: br.dialect(wl.dialect)})
    nup = naive.upsert
    for sid, subscriber, filt in wl.subs:
        nup(Sub(id=sid, exchange=ex, subscriber=subscriber, filter=filt))
    rows["naive"].build_s = time.process_time() - t
    # The naive scan's state is the records themselves: ship them like the trie.
    rows["naive"].bytes_per_sub = rows["trie"].bytes_per_sub
    rows["naive"].load_s = t_unpickle + rows["naive"].build_s
    rows["naive"].notes.append("bytes = pickled records; load = unpickle + build")
    log(f"  build {rows['naive'].build_s:.2f}s")

    # ---- topics
    cold_topics = wl.distinct_topics(rng, args.cold_topics + WARM)
    warm_topics, cold_topics = cold_topics[:WARM], cold_topics[WARM:]
    nbatches = args.batches or (2 if profile == "fanout" and n >= 1_000_000 else 5)
    batches = [make_frame(ex, wl.zipf_topics(nprng, args.batch_size), b * args.batch_size) for b in range(nbatches)]
    distinct = [b["routing_key"].nunique() for b in batches]

    # ---- verification: all three agree
    log(f"{profile} N={n}: verifying bitroute == trie on {args.verify} topics, == naive on a sample")
    m = br.Matcher(loaded)
    vtopics = cold_topics[: args.verify // 2] + batches[0]["routing_key"].drop_duplicates().tolist()[: args.verify // 2]
    vtopics += (["", "nosuch", "a.b.c.d.e.f.g.h", "site0", "site0/dev0", "$SYS/x/y"] if wl.dialect == "mqtt"
                else ["", "nosuch", "a..b", "w00"])
    vtopics = [t for t in vtopics if t]  # an empty MQTT topic is invalid: checked elsewhere
    match_counts, deliv_counts = [], []
    for topic in vtopics:
        got = normalise(m.match(ex, topic))
        want = normalise(tr.match(topic))
        if got != want:
            diff = {s: (got.get(s), want.get(s)) for s in set(got) | set(want) if got.get(s) != want.get(s)}
            raise SystemExit(
                f"MISMATCH bitroute vs trie on {topic!r}: {len(diff)} subscribers differ, e.g. {list(diff.items())[:5]}"
            )
        match_counts.append(sum(len(v) for v in want.values()))
        deliv_counts.append(len(want))
    # (the naive scan is checked on the topics it is timed on, below)
    # the batch paths agree with match() row by row
    vframe = batches[0].iloc[: args.verify].reset_index(drop=True)
    got, errors = m.match_columns(*columns(vframe))
    out_type = got.type
    want_frame = trie_mod.trie_match_frame(tr, vframe, out_type)
    for i, (a, b, err) in enumerate(
        zip(got.to_pylist(), want_frame["deliveries"].tolist(), errors.tolist(), strict=True)
    ):
        if err is not None:
            raise SystemExit(f"MISMATCH: match_columns error {err!r} on {vframe['routing_key'][i]!r}")
        if normalise_frame_row(a) != normalise_frame_row(b):
            raise SystemExit(f"MISMATCH match_columns vs trie frame on {vframe['routing_key'][i]!r}")
    log(f"  agree on {len(vtopics)} topics, and match_columns on {len(vframe)} publishes")
    del m, got, want_frame

    def dist(xs):
        return f"{np.mean(xs):.1f} (min {min(xs)}, median {int(np.median(xs))}, max {max(xs)})"

    # ---- cold per-topic: bitroute and trie interleaved topic by topic (the
    # order alternating), so that load from other processes hits both alike
    log(f"{profile} N={n}: cold match, {len(cold_topics)} distinct topics")
    pc = time.perf_counter_ns
    gc.collect()
    m = br.Matcher(loaded)
    match = m.match
    tmatch = tr.match
    for topic in warm_topics:  # lazy per-matcher set-up, not the topic cache
        match(ex, topic)
        tmatch(topic)
    ns_b, ns_t = [], []
    for k, topic in enumerate(cold_topics):
        if k & 1:
            t = pc()
            match(ex, topic)
            t1 = pc()
            tmatch(topic)
            t2 = pc()
            ns_b.append(t1 - t)
            ns_t.append(t2 - t1)
        else:
            t = pc()
            tmatch(topic)
            t1 = pc()
            match(ex, topic)
            t2 = pc()
            ns_t.append(t1 - t)
            ns_b.append(t2 - t1)
    for impl, ns in (("bitroute", ns_b), ("trie", ns_t)):
        rows[impl].cold_median_us, rows[impl].cold_p99_us, rows[impl].cold_n = pctl(ns, 50), pctl(ns, 99), len(ns)
    del m, match
    log(
        f"  bitroute median {rows['bitroute'].cold_median_us:.2f}us, trie {rows['trie'].cold_median_us:.2f}us; naive "
        f"(budget {args.naive_budget:.0f}s)"
    )
    gc.collect()
    nmatch = naive.match
    nmatch(ex, warm_topics[0])
    ns = []
    deadline = time.perf_counter() + args.naive_budget
    for topic in cold_topics:
        t = pc()
        matched = nmatch(ex, topic)
        ns.append(pc() - t)
        got, want = normalise(matched), normalise(tr.match(topic))
        if got != want:
            diff = {s: (got.get(s), want.get(s)) for s in set(got) | set(want) if got.get(s) != want.get(s)}
            raise SystemExit(
                f"MISMATCH naive vs trie on {topic!r}: {len(diff)} subscribers differ, e.g. {list(diff.items())[:5]}"
            )
        if len(ns) >= NAIVE_MIN_TOPICS and time.perf_counter() > deadline:
            break
    rows["naive"].cold_median_us, rows["naive"].cold_p99_us, rows["naive"].cold_n = pctl(ns, 50), pctl(ns, 99), len(ns)
    naive_mean_s = float(np.mean(ns)) / 1e9
    log(f"  naive median {rows['naive'].cold_median_us:.0f}us on {len(ns)} topics (and agrees with the trie on them)")

    # ---- batches: CPU time of this process (pyarrow threads included), the
    # two implementations alternating batch by batch
    log(
        f"{profile} N={n}: {len(batches)} batches of {args.batch_size} Zipf publishes ({dist(distinct)} distinct "
        "topics each)"
    )
    cpu = time.process_time
    gc.collect()
    m = br.Matcher(loaded)
    times_b, times_t = [], []
    trie_budget_hit = False
    for i, b in enumerate(batches):
        task_columns = columns(b)
        t = cpu()
        m.match_columns(*task_columns)
        times_b.append(cpu() - t)
        if trie_budget_hit:
            continue
        t = cpu()
        trie_mod.trie_match_frame(tr, b, out_type)
        times_t.append(cpu() - t)
        if sum(times_t) > args.trie_batch_budget:
            trie_budget_hit = i + 1 < len(batches)
    del m
    for impl, times in (("bitroute", times_b), ("trie", times_t)):
        rows[impl].first_pps = args.batch_size / times[0]
        rows[impl].steady_pps = args.batch_size * len(times) / sum(times)
    if trie_budget_hit:
        rows["trie"].batch_note = f"{len(times_t)} batch(es): over its {args.trie_batch_budget:.0f}s budget"
    log(f"  bitroute {rows['bitroute'].steady_pps:,.0f}/s, trie {rows['trie'].steady_pps:,.0f}/s")
    est = distinct[0] * naive_mean_s
    if est <= args.naive_budget:
        gc.collect()
        b = batches[0]
        t = cpu()
        seen = {}
        for key in b["routing_key"].tolist():
            if key not in seen:
                seen[key] = nmatch(ex, key)
        rows["naive"].first_pps = rows["naive"].steady_pps = len(b) / (cpu() - t)
        rows["naive"].batch_note = "match() per distinct topic, 1 batch"
    else:
        rows["naive"].first_pps = rows["naive"].steady_pps = len(batches[0]) / est
        rows["naive"].batch_note = "~ estimated: cold mean x distinct topics"

    # ---- optional profiles
    if args.cprofile:
        os.makedirs(args.cprofile, exist_ok=True)
        m = br.Matcher(loaded)
        for topic in warm_topics:
            m.match(ex, topic)
        pr = cProfile.Profile()
        pr.enable()
        for topic in cold_topics:
            m.match(ex, topic)
        pr.disable()
        dump_profile(pr, os.path.join(args.cprofile, f"{profile}-{n}-cold"))
        m = br.Matcher(loaded)
        task_columns = columns(batches[0])
        pr = cProfile.Profile()
        pr.enable()
        m.match_columns(*task_columns)
        pr.disable()
        dump_profile(pr, os.path.join(args.cprofile, f"{profile}-{n}-batch"))
        del m

    res = Result(
        profile=profile,
        n=n,
        description=wl.description,
        subscribers=wl.subscribers,
        matches_per_topic=dist(match_counts),
        deliveries_per_topic=dist(deliv_counts),
        distinct_per_batch=dist(distinct),
        rows=rows,
    )
    del naive, tr, loaded, batches, wl
    gc.collect()
    return res


@dataclass
class CliResult:
    profile: str
    n: int
    topic_lines: int
    output_bytes: int
    bitroute_cpu: list[float]
    trie_cpu: list[float]


def run_cli(profile: str, n: int, args) -> CliResult:
    """``bitroute match`` against ``python benchmarks/trie.py`` (same files,
    same output, checked byte for byte): CPU seconds of each whole process
    (user + system, from the kernel's accounting of the finished child),
    the two alternating, ``--cli-runs`` times each."""
    import resource
    import tempfile

    wl = workload.RANKED_PROFILES[profile](n, args.seed)
    lines = args.cli_topics if not (profile == "fanout" and n >= 1_000_000) else args.cli_topics // 10
    nprng = np.random.default_rng([args.seed, n, 7])
    topics = wl.zipf_topics(nprng, lines)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory(prefix="bitroute-cli-") as tmp:
        subs_path, topics_path = os.path.join(tmp, "subs.jsonl"), os.path.join(tmp, "topics.jsonl")
        with open(subs_path, "w") as f:
            for sid, subscriber, filt in wl.subs:
                f.write(json.dumps({"id": sid, "filter": filt, "subscriber": subscriber}) + "\n")
        with open(topics_path, "w") as f:
            for topic in topics:
                f.write(json.dumps({"topic": topic}) + "\n")
        del wl, topics
        common = ["--dialect", workloads_dialect(profile), "--subscriptions", subs_path, "--topics", topics_path]
        commands = {
            "bitroute": [os.path.join(root, ".venv", "bin", "bitroute"), "match", *common],
            "trie": [sys.executable, os.path.join(root, "benchmarks", "trie.py"), *common],
        }
        outputs: dict[str, bytes] = {}
        times: dict[str, list[float]] = {"bitroute": [], "trie": []}
        for run in range(args.cli_runs):
            for impl in ("bitroute", "trie") if run % 2 == 0 else ("trie", "bitroute"):
                out_path = os.path.join(tmp, f"{impl}.out")
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                with open(out_path, "wb") as out:
                    subprocess.run(commands[impl], stdout=out, check=True, cwd=root)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                times[impl].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
                if impl not in outputs:
                    with open(out_path, "rb") as out:
                        outputs[impl] = out.read()
                log(f"  cli {profile} {n}: {impl} {times[impl][-1]:.2f} CPU s")
        if outputs["bitroute"] != outputs["trie"]:
            raise SystemExit(f"MISMATCH: bitroute match and the trie script print different output ({profile}, {n})")
    return CliResult(profile, n, lines, len(outputs["bitroute"]), times["bitroute"], times["trie"])


def workloads_dialect(profile: str) -> str:
    return {"devices": "mqtt", "fanout": "amqp"}[profile]


def print_cli(results: list[CliResult]) -> None:
    print("\n### bitroute match vs the trie script (JSON Lines in and out, whole process)\n")
    print(
        "| profile | N | topic lines | output MB | bitroute CPU s (median) | trie CPU s (median) | bitroute vs trie "
        "| target >= 3x |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        b, t = float(np.median(r.bitroute_cpu)), float(np.median(r.trie_cpu))
        print(
            f"| {r.profile} | {r.n:,} | {r.topic_lines:,} | {r.output_bytes / 1e6:.1f} | {b:.2f} | {t:.2f} | "
            f"{ratio(t, b)} | {'met' if t / b >= 3 else '**MISSED**'} |"
        )
    sys.stdout.flush()


def dump_profile(pr: cProfile.Profile, path: str) -> None:
    pr.dump_stats(path + ".prof")
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    st.sort_stats("tottime").print_stats(25)
    st.sort_stats("cumulative").print_stats(25)
    with open(path + ".txt", "w") as f:
        f.write(s.getvalue())
    log(f"  profile written to {path}.txt")


def profile_only(br: Bitroute, profile: str, n: int, args) -> None:
    """cProfile of bitroute alone (no trie, no naive scan): the build, the cold
    loop, the first batch on a fresh matcher and a later batch on the same
    matcher.  Writes DIR/<profile>-<n>-<step>.txt (top functions by own and
    cumulative time) and .prof files for pstats/snakeviz."""
    out = args.cprofile
    os.makedirs(out, exist_ok=True)
    wl = workload.RANKED_PROFILES[profile](n, args.seed)
    ex = wl.exchange
    Sub = br.Subscription
    gc.collect()
    pr = cProfile.Profile()
    pr.enable()
    index = br.RoutingIndex({ex: br.dialect(wl.dialect)})
    for sid, subscriber, filt in wl.subs:
        index.upsert(Sub(id=sid, exchange=ex, subscriber=subscriber, filter=filt))
    snap = index.snapshot(1, {0: n})
    br.Matcher(snap)
    pr.disable()
    dump_profile(pr, os.path.join(out, f"{profile}-{n}-build"))
    del index
    rng = random.Random(f"topics/{profile}/{n}/{args.seed}")
    topics = wl.distinct_topics(rng, args.cold_topics + WARM)
    nprng = np.random.default_rng([args.seed, n, sorted(workload.RANKED_PROFILES).index(profile)])
    batches = [make_frame(ex, wl.zipf_topics(nprng, args.batch_size), b * args.batch_size) for b in range(2)]
    m = br.Matcher(snap)
    for topic in topics[:WARM]:
        m.match(ex, topic)
    pr = cProfile.Profile()
    pr.enable()
    for topic in topics[WARM:]:
        m.match(ex, topic)
    pr.disable()
    dump_profile(pr, os.path.join(out, f"{profile}-{n}-cold"))
    m = br.Matcher(snap)
    for step, b in (("first-batch", batches[0]), ("second-batch", batches[1])):
        task_columns = columns(b)
        pr = cProfile.Profile()
        pr.enable()
        m.match_columns(*task_columns)
        pr.disable()
        dump_profile(pr, os.path.join(out, f"{profile}-{n}-{step}"))


# -- reporting --------------------------------------------------------------


def fmt_us(x: float) -> str:
    if x != x:
        return "n/a"
    if x >= 1000:
        return f"{x:,.0f}"
    return f"{x:.2f}" if x < 100 else f"{x:.0f}"


def fmt_num(x: float, unit: str = "") -> str:
    if x != x:
        return "n/a"
    if x < 10:
        return f"{x:.2g}{unit}"
    return f"{x:,.0f}{unit}"


def ratio(a: float, b: float) -> str:
    if a != a or b != b or b == 0:
        return "n/a"
    r = a / b
    return f"{r:,.0f}x" if r >= 100 else f"{r:.2f}x"


def print_result(r: Result) -> None:
    print(f"\n### {r.profile}, N = {r.n:,}\n")
    print(f"{r.description}.")
    print(
        f"Subscribers {r.subscribers:,}; per topic (verification sample): {r.matches_per_topic} matched "
        "subscriptions, "
        f"{r.deliveries_per_topic} deliveries; distinct topics per 10k batch: {r.distinct_per_batch}.\n"
    )
    print(
        "| impl | build s | bytes/sub | load s | cold median us | cold p99 us | topics timed | batch first pub/s | "
        "batch steady pub/s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in r.rows.values():
        bn = " ~" if row.batch_note.startswith("~") else ""
        print(
            f"| {row.impl} | {row.build_s:.2f} | {row.bytes_per_sub:.1f} | {row.load_s:.2f} | "
            f"{fmt_us(row.cold_median_us)} | "
            f"{fmt_us(row.cold_p99_us)} | {row.cold_n} | {fmt_num(row.first_pps)}{bn} | {fmt_num(row.steady_pps)}{bn} |"
        )
    b, t, nv = r.rows["bitroute"], r.rows["trie"], r.rows["naive"]
    print()
    print("| bitroute vs | build | bytes/sub | cold median | cold p99 | batch first | batch steady |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for other in (t, nv):
        print(
            f"| {other.impl} | {ratio(other.build_s, b.build_s)} | {ratio(other.bytes_per_sub, b.bytes_per_sub)} | "
            f"{ratio(other.cold_median_us, b.cold_median_us)} | {ratio(other.cold_p99_us, b.cold_p99_us)} | "
            f"{ratio(b.first_pps, other.first_pps)} | {ratio(b.steady_pps, other.steady_pps)} |"
        )
    notes = [
        f"{row.impl}: {'; '.join(row.notes + ([row.batch_note] if row.batch_note else []))}"
        for row in r.rows.values()
        if row.notes or row.batch_note
    ]
    if notes:
        print("\nNotes: " + ". ".join(notes) + ".")
    sys.stdout.flush()


def check_targets(results: list[Result]) -> None:
    """The targets of issue 11 that this run measured (the CLI's are in its own table)."""
    print("\n### Targets (issue 11)\n")
    lines = []
    for r in results:
        b, t = r.rows["bitroute"], r.rows["trie"]
        cold = ratio(t.cold_median_us, b.cold_median_us)
        checks = [("cold median >= 2x trie", t.cold_median_us / b.cold_median_us >= 2, cold)]
        if r.profile == "devices" and r.n == 1_000_000:
            checks += [
                ("cold median <= 5 us", b.cold_median_us <= 5, f"{b.cold_median_us:.2f} us"),
                ("batches >= 1M pub/s, first batch", b.first_pps >= 1e6, f"{b.first_pps:,.0f} pub/s"),
                ("batches >= 1M pub/s, steady", b.steady_pps >= 1e6, f"{b.steady_pps:,.0f} pub/s"),
                ("full build <= 5 s", b.build_s <= 5, f"{b.build_s:.2f} s"),
                ("churn >= 50k changes/s", b.churn_per_s >= 50_000, f"{b.churn_per_s:,.0f} changes/s"),
                ("snapshot <= 40 bytes/sub", b.bytes_per_sub <= 40, f"{b.bytes_per_sub:.1f} bytes"),
                ("Matcher load <= 1 s", b.load_s <= 1, f"{b.load_s:.2f} s"),
            ]
        if r.profile == "fanout" and r.n == 1_000_000:
            checks += [
                ("batches >= 10x trie, first", b.first_pps >= 10 * t.first_pps, ratio(b.first_pps, t.first_pps)),
                ("batches >= 10x trie, steady", b.steady_pps >= 10 * t.steady_pps, ratio(b.steady_pps, t.steady_pps)),
                ("full build <= 5 s", b.build_s <= 5, f"{b.build_s:.2f} s"),
                ("churn >= 50k changes/s", b.churn_per_s >= 50_000, f"{b.churn_per_s:,.0f} changes/s"),
                ("Matcher load <= 1 s", b.load_s <= 1, f"{b.load_s:.2f} s"),
            ]
        for name, ok, val in checks:
            lines.append(f"| {r.profile} {r.n:,} | {name} | {val} | {'met' if ok else '**MISSED**'} |")
    if lines:
        print("| config | target | measured | |")
        print("|---|---|---|---|")
        print("\n".join(lines))
    else:
        print("(no configuration with a target in this run)")


def machine() -> str:
    import pyroaring

    try:
        with open("/proc/cpuinfo") as cpuinfo:
            cpu = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    try:
        commit = subprocess.run(
            ["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", os.path.dirname(os.path.abspath(__file__)), "status", "--porcelain", "--", "compiler"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "?", ""
    aff = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{cpu}; nproc {os.cpu_count()}, load average {load} at start, this process pinned to CPUs {aff}; Python "
        f"{platform.python_version()}, "
        f"pyroaring {pyroaring.__version__}, pandas {pd.__version__}, pyarrow {__import__('pyarrow').__version__}, "
        f"numpy {np.__version__}; "
        + (COMPILER_SOURCE or f"working tree at {commit}{' with compiler/ modified' if dirty else ''}")
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10000,100000,1000000")
    p.add_argument("--profiles", default="devices,fanout")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cold-topics", type=int, default=2000, help="distinct topics timed cold (default 2000)")
    p.add_argument(
        "--batches",
        type=int,
        default=None,
        help="batches per configuration (default 5; 2 for fan-out at >= 1M, whose batches hold ~60M deliveries)",
    )
    p.add_argument("--batch-size", type=int, default=10_000)
    p.add_argument("--verify", type=int, default=400, help="topics checked for agreement (default 400)")
    p.add_argument("--naive-budget", type=float, default=20.0, help="seconds of naive scan per step (default 20)")
    p.add_argument(
        "--trie-batch-budget",
        type=float,
        default=120.0,
        help="CPU seconds after which the trie runs no further batches (default 120)",
    )
    p.add_argument("--cprofile", metavar="DIR", help="also write cProfile stats of bitroute to DIR")
    p.add_argument(
        "--profile-only",
        action="store_true",
        help="with --cprofile: only profile bitroute (build, cold loop, two batches); no tables",
    )
    p.add_argument(
        "--compiler-ref",
        metavar="REF",
        help="benchmark compiler/ as committed at git REF (exported to a temporary directory), "
        "not the working tree; the kernel is the one installed in .venv, so REF must be "
        "from before the kernel (pure Python) or use the installed kernel's interface",
    )
    p.add_argument("--pin-cpu", type=int, help="pin this process to one CPU (like taskset -c)")
    p.add_argument(
        "--churn",
        type=int,
        default=100_000,
        help="subscription changes applied to the built index for the churn figure (default 100000)",
    )
    p.add_argument("--cli", action="store_true", help="also compare bitroute match with the trie script")
    p.add_argument("--cli-only", action="store_true", help="only the bitroute match comparison")
    p.add_argument(
        "--cli-topics",
        type=int,
        default=20_000,
        help="topic lines in the CLI comparison (default 20000; a tenth for fanout at >= 1M)",
    )
    p.add_argument("--cli-runs", type=int, default=3, help="runs of each command (default 3)")
    p.add_argument(
        "--smoke", action="store_true", help="toy size, seconds: devices at 1,000 subscriptions, small batches"
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.sizes, args.profiles, args.cold_topics, args.batches = "1000", "devices", 100, 2
        args.batch_size, args.verify, args.churn = 1000, 50, 1000
        args.naive_budget, args.trie_batch_budget = 1.0, 5.0
    if args.pin_cpu is not None:
        os.sched_setaffinity(0, {args.pin_cpu})
    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s]
    profiles = [s.strip().replace("fan-out", "fanout") for s in args.profiles.split(",") if s.strip()]
    for prof in profiles:
        if prof not in workload.RANKED_PROFILES:
            p.error(f"unknown profile {prof!r}; choose from {', '.join(workload.RANKED_PROFILES)}")
    global COMPILER_SOURCE
    if args.compiler_ref:
        import tempfile

        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        rev = subprocess.run(
            ["git", "-C", repo, "rev-parse", "--short", args.compiler_ref], capture_output=True, text=True, check=True
        ).stdout.strip()
        tmp = tempfile.mkdtemp(prefix=f"bitroute-compiler-{rev}-")
        archive = subprocess.run(
            ["git", "-C", repo, "archive", rev, "compiler"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        sys.path.insert(0, tmp)
        last = subprocess.run(
            ["git", "-C", repo, "log", "-1", "--format=%h", rev, "--", "compiler"], capture_output=True, text=True
        ).stdout.strip()
        COMPILER_SOURCE = f"compiler/ as committed at {rev} (last compiler/ commit {last})"
    br = Bitroute()
    if not os.path.abspath(br.compiler.__file__ or "").startswith(os.path.abspath(sys.path[0])) and args.compiler_ref:
        raise SystemExit(f"compiler imported from {br.compiler.__file__}, not from {args.compiler_ref}")
    print("## compiler benchmark\n")
    print(f"Machine: {machine()}.\n")
    print(f"Command: python -m benchmarks compiler {' '.join(argv if argv is not None else sys.argv[1:])}\n")
    results = []
    if args.cli or args.cli_only:
        cli_results = [run_cli(prof, n, args) for prof in profiles for n in sizes]
        print_cli(cli_results)
        if args.cli_only:
            return 0
    if args.profile_only:
        if not args.cprofile:
            p.error("--profile-only needs --cprofile DIR")
        for prof in profiles:
            for n in sizes:
                log(f"{prof} N={n}: profiling bitroute")
                profile_only(br, prof, n, args)
        return 0
    for prof in profiles:
        for n in sizes:
            r = run_config(br, prof, n, args)
            print_result(r)
            results.append(r)
    check_targets(results)
    print(f"\nLoad average at the end: {'/'.join(f'{x:.1f}' for x in os.getloadavg())} (1/5/15 min).")
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
