"""The router's durable state: snapshot versions and the batch -> version pins.

Layout under ``<streaming.checkpoint_dir>/router/``::

    router-id                    this router's identity (the Delta txnAppId stem)
    snapshots/<version>.changes  JSON: the changelog changes that produced <version>
    snapshots/<version>.snapshot the compiler's snapshot bytes (Snapshot.to_bytes)
    pins/<batch id>              the snapshot version micro-batch <batch id> used

Invariants:

- Every file is written whole or not at all (temporary file, fsync, rename,
  fsync of the folder), so a router killed at any instant leaves either the
  old state or the new one.
- A version's ``.changes`` file is written before its ``.snapshot`` file, so a
  version whose snapshot exists also has its changes: a restart re-appends
  them to the Delta ``subscriptions`` table (idempotently), which is how a
  crash between persisting a version and auditing it loses no audit row.
- A pin is written before a batch writes anything and is never rewritten: a
  replayed batch finds it and uses the same version (deterministic replay).
- :meth:`SnapshotStore.prune` keeps the pins of the last :data:`PINS_KEPT`
  batches, the snapshots they name, and the latest snapshot. Spark replays
  only the last batch whose commit was not written, so that is ample.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from streaming.errors import BitrouteError

PINS_KEPT = 16
"""Pins of this many most recent batch ids survive pruning (Spark replays at most the last)."""

_SNAPSHOT_SUFFIX = ".snapshot"
_CHANGES_SUFFIX = ".changes"


class SnapshotStoreError(BitrouteError):
    """The store is missing something a replay needs, or holds an unreadable file."""


@dataclass(frozen=True)
class StoredVersion:
    """One persisted snapshot version: its bytes and the changes (JSON arrays) that made it."""

    version: int
    data: bytes
    changes: list[list]


class SnapshotStore:
    """Snapshot versions and batch pins in one local folder (see the module docstring).

    Used by one router process at a time; not thread-safe.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()
        self._snapshots = self.root / "snapshots"
        self._pins = self.root / "pins"
        self._snapshots.mkdir(parents=True, exist_ok=True)
        self._pins.mkdir(parents=True, exist_ok=True)
        for folder in (self.root, self._snapshots, self._pins):
            for stale in folder.glob(".*.tmp"):  # left by a process killed mid-write
                stale.unlink(missing_ok=True)

    def router_id(self) -> str:
        """This router's identity, created at first use and stable across restarts.

        A fresh checkpoint folder is a fresh router: its Delta writes are not
        mistaken for replays of another router's batches.
        """
        path = self.root / "router-id"
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            _write_atomic(path, f"{uuid.uuid4().hex}\n".encode())
            return path.read_text().strip()

    def save(self, version: int, data: bytes, changes: Sequence[Sequence]) -> None:
        """Persist ``version`` (its changes first, then its bytes); overwrites nothing else."""
        _write_atomic(self._snapshots / f"{version}{_CHANGES_SUFFIX}",
                      json.dumps(changes, ensure_ascii=False).encode("utf-8"))
        _write_atomic(self._snapshots / f"{version}{_SNAPSHOT_SUFFIX}", data)

    def versions(self) -> list[int]:
        """The persisted versions, ascending."""
        return sorted(int(p.name[:-len(_SNAPSHOT_SUFFIX)]) for p in self._snapshots.iterdir()
                      if p.name.endswith(_SNAPSHOT_SUFFIX) and p.name[:-len(_SNAPSHOT_SUFFIX)].isdigit())

    def latest(self) -> StoredVersion | None:
        """The highest persisted version, or None when there is none."""
        versions = self.versions()
        return self.load(versions[-1]) if versions else None

    def load(self, version: int) -> StoredVersion:
        """The persisted ``version``; raises :class:`SnapshotStoreError` when it is gone."""
        try:
            data = (self._snapshots / f"{version}{_SNAPSHOT_SUFFIX}").read_bytes()
            changes = json.loads((self._snapshots / f"{version}{_CHANGES_SUFFIX}").read_bytes())
        except FileNotFoundError:
            raise SnapshotStoreError(f"snapshot version {version} is not in {self._snapshots}") from None
        except json.JSONDecodeError as exc:
            raise SnapshotStoreError(f"changes of snapshot version {version} are unreadable: {exc}") from None
        return StoredVersion(version, data, changes)

    def pin(self, batch_id: int, version: int) -> None:
        """Record that ``batch_id`` uses ``version``; a batch's pin is written once."""
        path = self._pins / str(batch_id)
        if path.exists():
            raise SnapshotStoreError(f"batch {batch_id} is pinned already (to {self.pinned(batch_id)})")
        _write_atomic(path, f"{version}\n".encode())

    def pinned(self, batch_id: int) -> int | None:
        """The version pinned for ``batch_id``, or None when the batch never started writing."""
        try:
            text = (self._pins / str(batch_id)).read_text().strip()
        except FileNotFoundError:
            return None
        if not text.isdigit():
            raise SnapshotStoreError(f"pin of batch {batch_id} is unreadable: {text!r}")
        return int(text)

    def forget_batches(self) -> None:
        """Drop every pin and take a new router id: the batch ids of a new
        streaming checkpoint start again at 0 and must not meet old pins, nor
        be mistaken by Delta for replays of the old batches."""
        for pin in self._pins.iterdir():
            pin.unlink(missing_ok=True)
        _write_atomic(self.root / "router-id", f"{uuid.uuid4().hex}\n".encode())

    def has_pins(self) -> bool:
        return any(p.name.isdigit() for p in self._pins.iterdir())

    def prune(self) -> None:
        """Drop pins older than the last :data:`PINS_KEPT` batches and every snapshot
        that is neither the latest nor pinned by a kept pin."""
        batches = sorted(int(p.name) for p in self._pins.iterdir() if p.name.isdigit())
        for batch_id in batches[:-PINS_KEPT]:
            (self._pins / str(batch_id)).unlink(missing_ok=True)
        keep = {self.pinned(b) for b in batches[-PINS_KEPT:]}
        versions = self.versions()
        keep.update(versions[-1:])
        for version in versions:
            if version not in keep:
                # The snapshot goes first: a version without its snapshot file is no version.
                (self._snapshots / f"{version}{_SNAPSHOT_SUFFIX}").unlink(missing_ok=True)
                (self._snapshots / f"{version}{_CHANGES_SUFFIX}").unlink(missing_ok=True)


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all, durably (survives a crash of the machine too)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
