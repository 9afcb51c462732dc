"""bitroute status on a real broker, with the router's files laid out as its contract says.

A child process holds the router lock (streaming.state.lock.RouterLock) as a
running router does; status.json, Spark's offset and commit logs and a
persisted snapshot are written as the router and Spark write them; the
publishes and the changelog are real topics, so the lags are Kafka's.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from router_runs import persist_snapshot
from streaming.cli.main import main
from streaming.config import Config, load
from streaming.kafka import client_verbs as client
from streaming.kafka.broker import free_port

REPO = Path(__file__).resolve().parents[3]
LAST_BATCH = {
    "query_id": "5b1e4c1e-query", "run_id": "9f2d-run", "batch_id": 7, "publishes": 120,
    "deliveries": 930, "rejected": 2, "snapshot_version": 3, "seconds": 1.25,
    "stages": {"catch_up": 0.01, "route": 0.84, "audit": 0.4},
    "routed_in": "executors",
    "finished_at": "2025-01-02T03:04:05+00:00", "subscriptions": 2,
    "audit_pending_batches": 1, "audit_lag_seconds": 2.5,
}


@pytest.fixture
def settings(isolated_settings, new_topic, workdir: Path) -> dict[str, str]:
    return isolated_settings(workdir, **{"kafka.publishes_topic": new_topic(partitions=2)})


@pytest.fixture
def cfg(settings: dict[str, str]) -> Config:
    return load(overrides=settings, environ={})


@pytest.fixture
def router_lock(cfg: Config):
    """Start a child process that holds the router lock until the returned stop() is called."""
    children = []

    def hold() -> subprocess.Popen:
        child = subprocess.Popen(
            [sys.executable, "-c", "import sys; from streaming.state.lock import RouterLock; "
             f"RouterLock({str(cfg.streaming.checkpoint_dir)!r}).acquire(); "
             "print('locked', flush=True); sys.stdin.read()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        children.append(child)
        assert child.stdout is not None and child.stdout.readline() == "locked\n"
        return child

    yield hold
    for child in children:
        if child.stdin is not None:  # a PIPE
            child.stdin.close()
        child.wait(timeout=30)


def _status(capsys, settings: dict[str, str], *args: str) -> tuple[int, str, str]:
    flags = [flag for key, value in settings.items() for flag in ("--set", f"{key}={value}")]
    status = main(["status", *args, *flags])
    out, err = capsys.readouterr()
    return status, out, err


def _router_files(cfg: Config, committed: dict[int, int]) -> None:
    """status.json, and Spark's logs: batch 7 committed at ``committed``, batch 8 started."""
    root = Path(cfg.streaming.checkpoint_dir)
    (root / "router").mkdir(parents=True, exist_ok=True)
    (root / "router" / "status.json").write_text(json.dumps(LAST_BATCH))
    query = root / "publishes"
    for folder in ("offsets", "commits"):
        (query / folder).mkdir(parents=True, exist_ok=True)
    topic = cfg.kafka.publishes_topic
    for batch, offsets in ((7, committed), (8, {p: o + 1 for p, o in committed.items()})):
        (query / "offsets" / str(batch)).write_text("\n".join([
            "v1",
            json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1735787045000, "conf": {}}),
            json.dumps({topic: {str(p): o for p, o in offsets.items()}}),
        ]))
    (query / "commits" / "7").write_text('v1\n{"nextBatchWatermarkMs":0}')


def _publish(cfg: Config, partition: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": cfg.kafka.bootstrap,
                         "logger": logging.getLogger("bitroute.kafka")})
    for i in range(count):
        producer.produce(cfg.kafka.publishes_topic, key=b"a.b", value=b"%d" % i, partition=partition)
    assert producer.flush(30) == 0


def test_status_of_a_running_router(capsys, settings, cfg, router_lock):
    client.subscribe(cfg, "amq.topic", "billing", "orders.#", sub_id="s1")
    client.subscribe(cfg, "amq.topic", "billing", "invoices.#", sub_id="s2")
    client.subscribe(cfg, "mqtt", "ops", "sensors/#", sub_id="s3")
    persist_snapshot(cfg, 3)
    client.unsubscribe(cfg, "s2")  # after the snapshot: one change of changelog lag
    _publish(cfg, 0, 5)
    _publish(cfg, 1, 4)
    _router_files(cfg, committed={0: 3})  # partition 1 not yet in the checkpoint: all 4 unrouted
    child = router_lock()

    status, out, err = _status(capsys, settings, "--json")
    assert (status, err) == (0, "")
    report = json.loads(out)
    assert report["running"] is True
    assert report["router"]["pid"] == child.pid
    assert report["router"]["host"] == socket.gethostname()
    assert report["last_batch"] == LAST_BATCH
    assert report["committed_batch"] == 7
    assert report["input_lag"] == {"topic": cfg.kafka.publishes_topic, "records": 6,
                                   "partitions": {"0": 2, "1": 4}}
    assert report["changelog_lag"]["records"] == 1
    assert (report["snapshot_version"], report["subscriptions"], report["subscribers"]) == (3, 3, 2)
    assert report["kafka_error"] is None

    status, out, _ = _status(capsys, settings)
    assert status == 0
    lines = dict(line.split(":", 1) for line in out.splitlines())
    assert lines["router"].strip().startswith(f"running, pid {child.pid} on {socket.gethostname()}")
    assert lines["query"].strip() == "5b1e4c1e-query (run 9f2d-run)"
    assert lines["last batch"].strip().startswith(
        "7: 120 publishes, 930 deliveries, 2 rejected, snapshot v3, 1.25s "
        "(catch_up 0.01s, route 0.84s, audit 0.40s; routed in the executors), "
        "finished 2025-01-02T03:04:05+00:00")
    assert lines["input lag"].strip() == (f"6 publishes not routed in {cfg.kafka.publishes_topic} "
                                          "(committed batch 7)")
    assert lines["changelog lag"].strip() == (f"1 changes not applied in "
                                              f"{cfg.kafka.subscriptions_topic} (snapshot v3)")
    assert lines["subscriptions"].strip() == "3 live, 2 subscribers (snapshot v3)"
    assert lines["audit"].strip() == "1 batches pending, 2.50s behind"


def test_status_says_when_no_router_runs(capsys, settings, cfg, router_lock):
    client.subscribe(cfg, "amq.topic", "billing", "orders.#", sub_id="s1")
    _publish(cfg, 0, 2)

    status, out, _ = _status(capsys, settings)
    assert status == 3
    assert out.splitlines()[0].split() == ["router:", "NOT", "RUNNING"]
    status, out, _ = _status(capsys, settings, "--json")
    report = json.loads(out)
    assert (status, report["running"], report["router"], report["last_batch"]) == (3, False, None,
                                                                                   None)
    assert report["input_lag"]["records"] == 2  # nothing committed: all of it from the earliest
    assert report["changelog_lag"]["records"] == 1  # no snapshot: the whole changelog

    # A router that held the lock and died: the lock file stays, the lock does not.
    child = router_lock()
    assert _status(capsys, settings)[0] == 0
    child.stdin.close()
    child.wait(timeout=30)
    assert (Path(cfg.streaming.checkpoint_dir) / "router.lock").exists()
    assert _status(capsys, settings)[0] == 3


def test_status_answers_fast_when_kafka_does_not(capsys, settings, cfg, router_lock):
    client.subscribe(cfg, "amq.topic", "billing", "orders.#", sub_id="s1")
    persist_snapshot(cfg, 1)
    router_lock()
    down = {**settings, "kafka.bootstrap": f"127.0.0.1:{free_port()}"}

    started = time.monotonic()
    status, out, err = _status(capsys, down, "--json")
    assert time.monotonic() - started < 2.0
    report = json.loads(out)
    assert (status, err, report["running"]) == (0, "", True)
    assert report["kafka_error"].startswith(f"cannot reach Kafka at {down['kafka.bootstrap']} ")
    assert report["input_lag"]["records"] is None and report["changelog_lag"]["records"] is None
    assert (report["snapshot_version"], report["subscriptions"]) == (1, 1)


def test_status_after_the_driver_exited_says_stopping_not_running(capsys, settings, cfg):
    """The watchdog keeps the lock while an exited driver's JVM ends: that is not running.

    A child stands for the driver: it takes the lock, records a JVM pid, hands
    the lock to a grandchild (the watchdog, which also stands for the JVM) and
    exits, as ``bitroute run`` does on SIGINT.
    """
    driver = subprocess.run(
        [sys.executable, "-c", "import os, subprocess, sys; from streaming.state.lock import RouterLock; "
         f"lock = RouterLock({str(cfg.streaming.checkpoint_dir)!r}); lock.acquire(); "
         "jvm = subprocess.Popen(['sleep', '60'], pass_fds=(lock.fd,), start_new_session=True, "
         "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
         "lock.note(jvm_pid=jvm.pid); print(jvm.pid, flush=True)"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    jvm = int(driver.stdout.strip())
    try:
        status, out, _ = _status(capsys, settings)
        pid = json.loads((Path(cfg.streaming.checkpoint_dir) / "router.lock").read_text())["pid"]
        assert out.splitlines()[0].split(None, 1) == [
            "router:", f"stopping: the driver (pid {pid}) exited, its JVM {jvm} is ending"]
        assert status == 3
        report = json.loads(_status(capsys, settings, "--json")[1])
        assert (report["running"], report["stopping"], report["router"]["jvm_pid"]) == (
            False, True, jvm)
    finally:
        os.kill(jvm, 9)
