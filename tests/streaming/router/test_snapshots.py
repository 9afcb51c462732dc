"""A batch's snapshot: versions with their recorded facts, pins, pruning, the read-only view
(a local folder, no Spark), and the owner's broadcast (a real SparkContext)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compiler import RoutingIndex, Snapshot, Subscription
from streaming.router.subscriptions.snapshots import (
    PINS_KEPT,
    BatchSnapshots,
    SnapshotFiles,
    SnapshotStore,
    SnapshotStoreError,
    SnapshotVersion,
)
from streaming.state.checkpoint import CheckpointLayout


def _layout(tmp_path: Path) -> CheckpointLayout:
    return CheckpointLayout.of(tmp_path)


def _version(version: int, data: bytes | None = None, reads_headers: bool = False) -> SnapshotVersion:
    return SnapshotVersion(version, data if data is not None else f"v{version}".encode(),
                           reads_headers)


def _compiled(version: int, with_criteria: bool) -> Snapshot:
    index = RoutingIndex({"amq.topic": "amqp"})
    value = (b'{"exchange": "amq.topic", "subscriber": "bob", "filter": "a.*"'
             + (b', "headers": {"match": "all", "criteria": {"region": "eu"}}}' if with_criteria
                else b"}"))
    index.upsert(Subscription.from_changelog(b"s1", value))
    return index.snapshot(version, {0: version})


def test_versions_round_trip_with_their_changes_and_facts(tmp_path: Path):
    store = SnapshotStore(_layout(tmp_path))
    assert store.latest() is None
    store.save(_version(0, b"empty"), [])
    store.save(_version(1, b"one", reads_headers=True), [("a", "upsert")])
    assert store.latest() == SnapshotVersion(1, b"one", True)
    assert store.changes(1) == [["a", "upsert"]]
    assert store.load(0) == SnapshotVersion(0, b"empty", False)
    with pytest.raises(SnapshotStoreError, match="version 7"):
        store.load(7)


def test_whether_a_version_reads_headers_is_recorded_from_its_tables(tmp_path: Path):
    assert SnapshotVersion.of(_compiled(1, with_criteria=True)).reads_headers
    assert not SnapshotVersion.of(_compiled(2, with_criteria=False)).reads_headers
    store = SnapshotStore(_layout(tmp_path))
    store.save(SnapshotVersion.of(_compiled(3, with_criteria=True)), [])
    assert SnapshotStore(_layout(tmp_path)).load(3).reads_headers


def test_a_version_saved_by_an_earlier_build_has_its_facts_read_from_the_snapshot(tmp_path: Path):
    layout = _layout(tmp_path)
    store = SnapshotStore(layout)
    for version, criteria in ((4, True), (5, False)):
        store.save(SnapshotVersion.of(_compiled(version, criteria)), [])
        layout.meta_file(version).unlink()  # what an earlier build left: changes and snapshot
    assert store.load(4).reads_headers and not store.load(5).reads_headers


def test_a_version_is_its_snapshot_file_and_a_half_written_one_does_not_count(tmp_path: Path):
    layout = _layout(tmp_path)
    store = SnapshotStore(layout)
    store.save(_version(3), [])
    # A crash between the changes file and the snapshot file of version 4:
    layout.changes_file(4).write_text("[]")
    (layout.snapshots / ".4.snapshot.123.tmp").write_bytes(b"partial")
    reopened = SnapshotStore(layout)
    assert reopened.versions() == [3]
    assert not list(layout.snapshots.glob(".*.tmp"))


def test_the_read_only_view_creates_and_deletes_nothing(tmp_path: Path):
    layout = _layout(tmp_path / "checkpoints")
    files = SnapshotFiles(layout)
    assert (files.latest(), files.versions(), files.pinned(0), files.has_pins()) == (None, [], None,
                                                                                      False)
    assert not (tmp_path / "checkpoints").exists()
    store = SnapshotStore(layout)
    store.save(_version(2), [])
    store.pin(9, 2)
    in_flight = layout.snapshots / ".3.snapshot.77.tmp"  # a router's write in progress
    in_flight.write_bytes(b"partial")
    assert (files.latest(), files.pinned(9)) == (_version(2), 2)
    assert in_flight.exists()


def test_a_pin_is_written_once_and_read_back(tmp_path: Path):
    store = SnapshotStore(_layout(tmp_path))
    assert store.pinned(5) is None
    store.pin(5, 2)
    assert SnapshotStore(_layout(tmp_path)).pinned(5) == 2
    with pytest.raises(SnapshotStoreError, match="batch 5 is pinned already"):
        store.pin(5, 3)


def test_prune_keeps_recent_pins_their_versions_and_the_latest(tmp_path: Path):
    layout = _layout(tmp_path)
    store = SnapshotStore(layout)
    for version in range(4):
        store.save(_version(version), [])
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
    assert sorted(os.listdir(layout.snapshots)) == sorted(
        f"{v}{suffix}" for v in (2, 3) for suffix in (".changes", ".meta", ".snapshot"))


def test_router_id_is_stable_until_the_batches_are_forgotten(tmp_path: Path):
    store = SnapshotStore(_layout(tmp_path))
    first = store.router_id()
    assert SnapshotStore(_layout(tmp_path)).router_id() == first
    store.pin(0, 0)
    assert store.has_pins()
    store.forget_batches()
    assert not store.has_pins() and store.pinned(0) is None
    assert store.router_id() != first


def test_versions_committed_without_batches_are_pruned_at_each_commit(tmp_path: Path):
    # Realtime mode (prune_at_commit): a version per subscription change and no batch pins
    # any: the folder holds the latest version (and what the pins of an earlier micro-batch
    # run name), not one version per change since the start.
    layout = _layout(tmp_path)
    store = SnapshotStore(layout)
    store.save(_version(0), [])
    store.pin(7, 0)  # an earlier micro-batch run's last batch
    snapshots = BatchSnapshots(store, prune_at_commit=True)
    for version in range(1, 1001):
        snapshots.commit(_version(version), [["s", "upsert"]])
    assert store.versions() == [0, 1000]
    assert len(os.listdir(layout.snapshots)) == 6
    assert snapshots.current == _version(1000) and store.changes(1000) == [["s", "upsert"]]


def test_the_owner_pins_each_batch_once_and_keeps_one_broadcast_alive(tmp_path: Path, spark):
    layout = _layout(tmp_path)
    snapshots = BatchSnapshots(SnapshotStore(layout), spark.sparkContext)
    first = SnapshotVersion.of(_compiled(0, with_criteria=True))
    snapshots.commit(first, [])
    catch_ups = []
    try:
        a = snapshots.for_batch(0, lambda: catch_ups.append(0))
        assert (a.version, a.reads_headers, a.rerun, catch_ups) == (0, True, False, [0])
        assert a.broadcast.value == first.data

        # A catch-up that reads changes commits the next version; the batch pins it.
        second = SnapshotVersion.of(_compiled(1, with_criteria=False))
        b = snapshots.for_batch(1, lambda: snapshots.commit(second, [["s1", "upsert"]]))
        assert (b.version, b.reads_headers, b.rerun, snapshots.current) == (1, False, False,
                                                                               second)
        assert b.key != a.key and b.broadcast.value == second.data
        assert SnapshotFiles(layout).pinned(1) == 1

        # A re-run of batch 0: its pinned version from disk, no catch-up, facts as recorded.
        again = snapshots.for_batch(0, lambda: pytest.fail("a re-run does not catch up"))
        assert (again.version, again.reads_headers, again.rerun) == (0, True, True)
        assert again.broadcast.value == first.data
        assert snapshots.for_batch(0, lambda: None).key == again.key  # still the live one
    finally:
        snapshots.close()
