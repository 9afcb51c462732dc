"""The router's durable state: snapshot versions, batch pins, pruning (a local folder, no Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streaming.router.snapshots import PINS_KEPT, SnapshotStore, SnapshotStoreError


def test_versions_round_trip_with_their_changes(tmp_path: Path):
    store = SnapshotStore(tmp_path)
    assert store.latest() is None
    store.save(0, b"empty", [])
    store.save(1, b"one", [("a", "upsert")])
    latest = store.latest()
    assert (latest.version, latest.data, latest.changes) == (1, b"one", [["a", "upsert"]])
    assert store.load(0).data == b"empty"
    with pytest.raises(SnapshotStoreError, match="version 7"):
        store.load(7)


def test_a_version_is_its_snapshot_file_and_a_half_written_one_does_not_count(tmp_path: Path):
    store = SnapshotStore(tmp_path)
    store.save(3, b"three", [])
    # A crash between the changes file and the snapshot file of version 4:
    (tmp_path / "snapshots" / "4.changes").write_text("[]")
    (tmp_path / "snapshots" / ".4.snapshot.123.tmp").write_bytes(b"partial")
    reopened = SnapshotStore(tmp_path)
    assert reopened.versions() == [3]
    assert not list((tmp_path / "snapshots").glob(".*.tmp"))


def test_a_pin_is_written_once_and_read_back(tmp_path: Path):
    store = SnapshotStore(tmp_path)
    assert store.pinned(5) is None
    store.pin(5, 2)
    assert SnapshotStore(tmp_path).pinned(5) == 2
    with pytest.raises(SnapshotStoreError, match="batch 5 is pinned already"):
        store.pin(5, 3)


def test_prune_keeps_recent_pins_their_versions_and_the_latest(tmp_path: Path):
    store = SnapshotStore(tmp_path)
    for version in range(4):
        store.save(version, f"v{version}".encode(), [])
    store.pin(0, 0)
    for batch in range(1, PINS_KEPT + 1):
        store.pin(batch, 1 if batch == 1 else 2)
    store.prune()
    assert store.pinned(0) is None
    assert store.pinned(1) == 1 and store.pinned(PINS_KEPT) == 2
    assert store.versions() == [1, 2, 3]
    store.pin(PINS_KEPT + 1, 3)
    store.prune()
    assert store.versions() == [2, 3]


def test_router_id_is_stable_until_the_batches_are_forgotten(tmp_path: Path):
    store = SnapshotStore(tmp_path)
    first = store.router_id()
    assert SnapshotStore(tmp_path).router_id() == first
    store.pin(0, 0)
    assert store.has_pins()
    store.forget_batches()
    assert not store.has_pins() and store.pinned(0) is None
    assert store.router_id() != first
