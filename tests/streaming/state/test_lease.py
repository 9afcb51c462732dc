"""The router lease on a local warehouse: one router per publishes topic and warehouse.

Real files and locks, two lease holders in one process standing for two routers
(the process-level test with `bitroute run` is in test_object_store.py, on S3).
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from streaming.config import Config, load
from streaming.state import lease as router_lease
from streaming.state.lease import LeaseHeldError, LeaseLostError, RouterLease


def _config(root: Path, checkpoint: str, topic: str = "pub") -> Config:
    return load(overrides={"delta.warehouse": str(root / "wh"),
                           "streaming.checkpoint_dir": str(root / checkpoint),
                           "kafka.publishes_topic": topic,
                           "streaming.lease_timeout": "30 seconds"}, environ={})


def test_a_second_router_is_refused_naming_the_first_which_keeps_its_lease(tmp_path: Path):
    first = RouterLease(_config(tmp_path, "one"))
    first.acquire(lambda: "router-1")
    try:
        with pytest.raises(LeaseHeldError) as refused:
            RouterLease(_config(tmp_path, "two")).acquire(lambda: "router-2")
        assert str(refused.value).startswith(
            f"another router routes pub into {tmp_path / 'wh'}: router router-1 on "
            f"{_held(first)['host']} (pid {_held(first)['pid']}, checkpoint {tmp_path / 'one'}, "
            "epoch 1), renewed 0s ago; stop it first")
        first.renew()
        first.check()  # still the holder
        assert _lease_record(_config(tmp_path, "one"))["router_id"] == "router-1"
        # Another publishes topic on the same warehouse is another stream: its own lease.
        other = RouterLease(_config(tmp_path, "two", topic="pub2"))
        other.acquire(lambda: "router-2")
        other.release()
    finally:
        first.release()


def test_the_same_router_id_from_another_host_carries_on_and_the_old_one_stops(tmp_path: Path):
    config = _config(tmp_path, "one")
    old = RouterLease(config)
    old.acquire(lambda: "router-1")
    blob = router_lease._blob(config)
    read = blob.read()
    assert read is not None
    data, tag = read
    blob.replace(json.dumps({**json.loads(data), "host": "old-host"}).encode(), tag)
    moved = RouterLease(_config(tmp_path, "moved-checkpoint"))
    moved.acquire(lambda: "router-1")  # the checkpoint folder moved: same id
    try:
        record = _lease_record(config)
        assert (record["router_id"], record["epoch"], record["checkpoint_dir"]) == \
            ("router-1", 2, str(tmp_path / "moved-checkpoint"))
        old._stop.set()  # its renewals are ours to drive here
        old.renew()  # finds the lease changed under it
        with pytest.raises(LeaseLostError, match=r"was taken over by router router-1"):
            old.check()
    finally:
        moved.release()


def test_a_stale_lease_is_taken_over_with_a_warning_and_a_released_one_at_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture):
    first = RouterLease(_config(tmp_path, "one"))
    first.acquire(lambda: "router-1")
    first._stop.set()  # a router that died: no more renewals
    late = datetime.now(UTC) + timedelta(seconds=31)
    with caplog.at_level(logging.WARNING, logger="streaming.state.lease"):
        second = RouterLease(_config(tmp_path, "two"), clock=lambda: late)
        second.acquire(lambda: "router-2")
    assert "taking over the router lease of router router-1" in caplog.text
    assert "not renewed for 31s" in caplog.text
    second.release()
    assert _lease_record(_config(tmp_path, "two"))["released_at"] is not None
    third = RouterLease(_config(tmp_path, "three"))
    third.acquire(lambda: "router-3")  # released: no wait
    assert _held(third)["epoch"] == 3
    third.release()


def test_audit_migrate_is_refused_while_a_router_of_another_checkpoint_holds_the_lease(
        tmp_path: Path):
    from streaming.audit.migration import migrate
    from streaming.state.lock import RouterLockedError

    running = RouterLease(_config(tmp_path, "one"))
    running.acquire(lambda: "router-1")
    try:
        with pytest.raises(RouterLockedError, match=r"router router-1 on .* holds the lease of "
                                                    r"pub in .*, renewed 0s ago"):
            migrate(_config(tmp_path, "two"))
    finally:
        running.release()
    assert {m.result for m in migrate(_config(tmp_path, "two"))} == {"missing"}


def _lease_record(config) -> dict:
    """The lease's record as stored (there is one)."""
    record = router_lease.read(config)
    assert record is not None, "no lease record"
    return record


def _held(lease: RouterLease) -> dict:
    assert lease.record is not None, "the lease is not held"
    return lease.record
