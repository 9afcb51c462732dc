"""A user's Spark runs OPTIMIZE, OPTIMIZE ZORDER BY and VACUUM on the audit tables
while a running router keeps appending to them: the audit stays exact.

A real router (``bitroute run``, a child process) routes a steady stream of
publishes and group-commits their audit every second; its maintenance passes
(vacuum, checkpoint, log cleanup) run every 2 s, its compaction held back
(``compact_min_files`` out of reach) so that it does not take the user's
files first: two compactions of the same files cannot both commit, and
docs/audit.md says what the loser does. A user's session, configured as
docs/audit.md says (its pyspark block, in a child process of its own, as in
audit/test_spark_reader.py), meanwhile compacts ``messages``, Z-orders
``deliveries`` by subscriber, and vacuums both with the tables' own retention
(``audit.file_retention``, the default hour). Each OPTIMIZE is run until one
of its commits raced a router commit (a router append landed between the
version it read and the one it wrote), so the test always covers the race.

Afterwards: exactly one ``deliveries`` row per (message, subscriber) the
router delivered and one ``messages`` row per publish; every row written
before the OPTIMIZE unchanged; the version each OPTIMIZE read still readable
(VACUUM kept the files it replaced); ``bitroute audit`` and Spark counting
the same; ``DESCRIBE HISTORY`` listing the user's OPTIMIZEs; the router's
committer never failing and a maintenance pass started after the user's
commands succeeding; and a compaction by the router's own maintenance
rewriting the files Spark wrote, the audit still exact.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import Producer
from deltalake import DeltaTable

from docs_session import SPARK_TIMEOUT_S, docs_session_script
from isolation import isolated_settings
from router_process import RouterProcess
from schemas.records import EXCHANGE_HEADER, message_id
from short_jvm import short_jvm_env
from streaming import jvm
from streaming.audit import maintenance as audit_maintenance, queries as audit
from streaming.config import Config, load
from streaming.kafka import client_verbs as client
from streaming.kafka.clients import record_position
from waiting import wait_until

PUBLISH_TABLES = ("messages", "deliveries")
DEADLINE_S = 300.0  # a bound, not an expectation
SUBSCRIBERS = {"orders.eu.paid": {"alpha", "beta"}, "orders.eu": {"alpha"}, "audit.none": set()}
"""Routing key -> who gets it, for alpha (orders.#) and beta (orders.*.paid)."""
REJECTED_EXCHANGE = "no-such-exchange"

_USER = '''
# Task counts for a small machine (Delta's defaults, 50 and 200 tasks a job, and VACUUM's
# file listing in spark.sql.sources.parallelPartitionDiscovery.parallelism tasks, 10,000,
# cost minutes on a busy 2-core one); the statements below are the user's as they stand.
spark.conf.set("spark.sql.shuffle.partitions", "2")
spark.conf.set("spark.databricks.delta.snapshotPartitions", "2")
spark.conf.set("spark.sql.sources.parallelPartitionDiscovery.parallelism", "2")

import json as _json
import sys as _sys


def _say(tag, value=None):
    print(tag if value is None else f"{tag} {_json.dumps(value, default=str)}", flush=True)


def _wait(tag):
    assert _sys.stdin.readline().strip() == tag


def _history(path, limit=""):
    return [r.asDict(recursive=True)
            for r in spark.sql(f"DESCRIBE HISTORY delta.`{path}` {limit}").collect()]


def _optimize(path, zorder=None):
    """The user's OPTIMIZE, run again until one commit raced a router commit. One that
    loses to the router's own compaction is run again, as a user would."""
    statement = f"OPTIMIZE delta.`{path}`" + (f" ZORDER BY ({zorder})" if zorder else "")
    done, lost = [], 0
    for _ in range(12):
        try:
            spark.sql(statement).collect()
        except Exception as exc:  # Delta's ConcurrentDeleteReadException and kin
            if "Concurrent" not in str(exc):
                raise
            lost += 1
            continue
        mine = [h for h in _history(path, "LIMIT 500") if h["operation"] == "OPTIMIZE"
                and (h["engineInfo"] or "").startswith("Apache-Spark")
                and h["version"] not in [d["version"] for d in done]]
        done += [{"version": h["version"], "readVersion": h["readVersion"],
                  "zOrderBy": h["operationParameters"].get("zOrderBy")} for h in mine]
        if any(d["readVersion"] < d["version"] - 1 for d in done):
            return {"commits": done, "lost": lost}
    raise AssertionError(f"no OPTIMIZE of {path} raced a router commit: {done}, lost {lost}")


_paths = {name: f"{warehouse}/{name}" for name in ("deliveries", "messages")}
_say("READY")
_wait("OPTIMIZE")
_say("OPTIMIZED", {"messages": _optimize(_paths["messages"]),
                   "deliveries": _optimize(_paths["deliveries"], zorder="subscriber")})
for _path in _paths.values():  # the table's own retention: no RETAIN clause
    spark.sql(f"VACUUM delta.`{_path}`").collect()
_say("VACUUMED")
_wait("COUNT")
_say("COUNTS", {name: {"count": spark.read.format("delta").load(path).count(),
                       "history": _history(path)} for name, path in _paths.items()})
spark.stop()
'''


class UserSpark:
    """The user's pyspark session in a child process, talking in tagged lines."""

    def __init__(self, script: str, workdir: Path) -> None:
        (workdir / "user.py").write_text(script)
        self._log = (workdir / "user-spark.log").open("w")
        # Its JVM lives a minute or two: short_jvm's options, as the router's (RouterProcess).
        self.process = subprocess.Popen([sys.executable, "user.py"], cwd=workdir, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self._log, start_new_session=True,
                                        env=short_jvm_env())
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout or ():  # a PIPE
            self.lines.put(line.rstrip("\n"))

    def tell(self, tag: str) -> None:
        stdin = self.process.stdin
        assert stdin is not None  # a PIPE
        stdin.write(tag + "\n")
        stdin.flush()

    def expect(self, tag: str, timeout: float = SPARK_TIMEOUT_S):
        def tagged() -> list | None:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                assert self.process.poll() is None, \
                    f"the user's Spark exited: {Path(self._log.name).read_text()[-3000:]}"
                return None
            if line == tag:
                return [None]
            if line.startswith(tag + " "):
                return [json.loads(line.removeprefix(tag + " "))]
            return None

        [said] = wait_until(tagged, f"{tag} from the user's Spark", timeout)
        return said

    def stop(self) -> None:
        # Its JVM is in its process group: the whole session goes.
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=60)


class Publisher:
    """Publishes the keys of SUBSCRIBERS (and a rejected one) in a loop until stopped;
    remembers each acknowledged publish by message id."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.sent: dict[str, tuple[str, str]] = {}  # message id -> (exchange, key)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        producer = Producer({"bootstrap.servers": self.config.kafka.bootstrap, "linger.ms": 5})
        keys = [("amq.topic", key) for key in SUBSCRIBERS] + [(REJECTED_EXCHANGE, "orders.eu")]
        while not self._stop.wait(0.1):  # pacing, about 40 publishes a second
            for exchange, key in keys:
                producer.produce(self.config.kafka.publishes_topic, key=key.encode(), value=b"x",
                                 headers=[(EXCHANGE_HEADER, exchange.encode())],
                                 on_delivery=self._acked(exchange, key))
            producer.flush(60)
        assert producer.flush(60) == 0

    def _acked(self, exchange: str, key: str):
        def acked(err, record) -> None:
            assert err is None, err
            self.sent[message_id(*record_position(record))] = \
                (exchange, key)
        return acked

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)


def _rows(config: Config, table: str) -> list[dict]:
    return audit.run(config, audit.AuditQuery(table))[1]


def _router_commits(config: Config, table: str) -> int:
    """Commits of the router's appends (delta-rs WRITE with a txn) in ``table``'s log."""
    return sum(1 for h in DeltaTable(config.delta.table_path(table)).history()
               if h.get("operation") == "WRITE")


def test_spark_optimize_and_vacuum_on_live_tables_leave_the_audit_exact(
        base_config: Config, tmp_path: Path):
    settings = isolated_settings(base_config, tmp_path, **{
        "audit.commit_interval": "1 seconds",
        "audit.maintenance_interval": "2 seconds",
        "audit.compact_min_files": "100000",
    })
    config = load(overrides=settings, environ={})
    warehouse = str(Path(config.delta.warehouse).absolute())
    script = docs_session_script(jvm.jars("delta")[0].parent, warehouse)
    script = script[:script.index("getOrCreate())") + len("getOrCreate())")] + "\n" + _USER
    client.subscribe(config, "amq.topic", "alpha", "orders.#", sub_id="a1")
    client.subscribe(config, "amq.topic", "beta", "orders.*.paid", sub_id="b1")

    user = UserSpark(script, tmp_path)  # its JVM starts while the router's does
    router = RouterProcess(settings, tmp_path / "router.log")
    publisher = None
    try:
        router.wait_for(re.compile(r"snapshot v\d+ with 2 subscriptions"))
        publisher = Publisher(config)
        wait_until(lambda: min(_router_commits(config, t) for t in PUBLISH_TABLES) >= 3,
                   "three router commits to each publish table", DEADLINE_S)
        before = {t: _rows(config, t) for t in PUBLISH_TABLES}
        user.expect("READY")

        user.tell("OPTIMIZE")
        optimized = user.expect("OPTIMIZED")
        user.expect("VACUUMED")
        user_done = datetime.now(UTC).isoformat(timespec="milliseconds")
        # The router still commits, and its maintenance passes, after the user's commands.
        commits = {t: _router_commits(config, t) for t in PUBLISH_TABLES}
        wait_until(lambda: all(_router_commits(config, t) > commits[t] for t in commits),
                   "a router commit to each table after the user's commands", DEADLINE_S)
        report = wait_until(lambda: (r := audit_maintenance.read_report(config)) and
                            r["started_at"] > user_done and r, "a maintenance pass after them", DEADLINE_S)
        assert report["ok"], report["error"]

        publisher.stop()
        sent = dict(publisher.sent)
        wait_until(lambda: len(_rows(config, "messages")) >= len(sent),
                   "every publish in the messages table", DEADLINE_S)
        user.tell("COUNT")
        counts = user.expect("COUNTS")
    finally:
        if publisher is not None:
            publisher.stop()
        status = router.terminate(signal.SIGTERM)
        user.stop()
    log = (tmp_path / "router.log").read_text()
    assert status == 0, log[-3000:]
    assert "the audit commit of" not in log, log[-3000:]  # the committer never failed

    # bitroute audit and the user's Spark count the same, and the audit is exact.
    messages, deliveries = _assert_exact(config, sent, before)
    assert (counts["messages"]["count"], counts["deliveries"]["count"]) == (
        len(messages), len(deliveries))

    # DESCRIBE HISTORY lists the user's OPTIMIZEs, the Z-order with its column; VACUUM
    # (the table's hour) kept the files they replaced: the versions they read still read.
    for table in PUBLISH_TABLES:
        history = {h["version"]: h for h in counts[table]["history"]}
        for run in optimized[table]["commits"]:
            assert history[run["version"]]["operation"] == "OPTIMIZE", (table, run)
            assert DeltaTable(config.delta.table_path(table), version=run["readVersion"]) \
                .to_pyarrow_table().num_rows > 0
    assert all("subscriber" in run["zOrderBy"] for run in optimized["deliveries"]["commits"])
    assert all(run["zOrderBy"] in (None, "[]") for run in optimized["messages"]["commits"])
    print(f"{len(sent)} publishes; the user's OPTIMIZE commits {json.dumps(optimized)}",
          file=sys.stderr)

    # The router's own compaction rewrites the files Spark wrote; the audit stays exact.
    compacting = load(overrides={**settings, "audit.compact_min_files": "2"}, environ={})
    report = audit_maintenance.maintain(compacting, tables=PUBLISH_TABLES)
    assert report.ok, report.error
    assert all(t.files_compacted >= 2 for t in report.tables), report.to_json()
    _assert_exact(config, sent, before)


def _assert_exact(config: Config, sent: dict[str, tuple[str, str]], before: dict[str, list]
                  ) -> tuple[list[dict], list[dict]]:
    """One messages row per publish with its outcome, one deliveries row per (message,
    subscriber) delivered, and every row of ``before`` unchanged (as bitroute audit reads)."""
    messages, deliveries = _rows(config, "messages"), _rows(config, "deliveries")
    assert Counter(r["message_id"] for r in messages) == Counter(list(sent))
    for row in messages:
        exchange, key = sent[row["message_id"]]
        expected = ("rejected" if exchange == REJECTED_EXCHANGE
                    else "routed" if SUBSCRIBERS[key] else "unroutable")
        assert (row["outcome"], row["deliveries"]) == (
            expected, len(SUBSCRIBERS[key]) if expected == "routed" else 0), row
    assert Counter((r["message_id"], r["subscriber"]) for r in deliveries) == Counter(
        (mid, who) for mid, (exchange, key) in sent.items() if exchange != REJECTED_EXCHANGE
        for who in SUBSCRIBERS[key])
    for table, rows in (("messages", messages), ("deliveries", deliveries)):
        now = {json.dumps(r, sort_keys=True) for r in rows}
        assert {json.dumps(r, sort_keys=True) for r in before[table]} <= now, table
    return messages, deliveries
