"""A batch's snapshot: the versions the changelog makes, saved, pinned, loaded and broadcast.

:class:`BatchSnapshots` is the one owner of the snapshot version in the
router's driver. The subscription state (:mod:`streaming.router.subscriptions.changelog`)
hands it each new version (:meth:`BatchSnapshots.commit`); a micro-batch gets
its version from it in one call (:meth:`BatchSnapshots.for_batch`): the pinned
version of a re-run batch, or else the version current after a changelog
catch-up, pinned; old pins and versions pruned; the version's bytes taken from
memory or from disk and broadcast to the executors once (one broadcast alive
at a time). What a batch needs of its version travels in the returned
:class:`BatchSnapshot`, including whether its matcher reads the publishes'
headers, a fact recorded with each version (:class:`SnapshotVersion`), not
guessed.

On disk (paths: :class:`streaming.state.checkpoint.CheckpointLayout`)::

    router-id                    this router's identity (the Delta txnAppId stem)
    snapshots/<version>.changes  JSON: the changelog changes that produced <version>
    snapshots/<version>.meta     JSON: {"reads_headers": bool}
    snapshots/<version>.snapshot the compiler's snapshot bytes (Snapshot.to_bytes)
    pins/<batch id>              the snapshot version micro-batch <batch id> used

:class:`SnapshotFiles` reads them and never writes (``bitroute status``,
``explain``, ``subscriptions`` use it while a router runs);
:class:`SnapshotStore` is the router's writable store.

Invariants:

- Every file is written whole or not at all (temporary file, fsync, rename,
  fsync of the folder), so a router killed at any instant leaves either the
  old state or the new one.
- A version's ``.changes`` and ``.meta`` files are written before its
  ``.snapshot`` file, so a version whose snapshot exists also has its changes:
  a restart re-appends them to the Delta ``subscriptions`` table
  (idempotently), which is how a crash between persisting a version and
  auditing it loses no audit row. A version saved by an earlier build has no
  ``.meta``: what it records is read from the snapshot itself.
- A pin is written before a batch writes anything and is never rewritten: a
  re-run batch finds it and uses the same version (a deterministic re-run).
- :meth:`SnapshotStore.prune` (at each batch's pin; in realtime mode at each
  commit) keeps the pins of the last :data:`PINS_KEPT` batches, the snapshots
  they name, and the latest snapshot. Spark re-runs only the last batch whose commit was not
  written, so that is ample.
- The current version is the latest persisted one: versions only grow, and a
  version is current once it is on disk.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from streaming.atomic import write_atomically
from streaming.router.errors import SnapshotStoreError
from streaming.state.checkpoint import CheckpointLayout

if TYPE_CHECKING:
    from pyspark import Broadcast, SparkContext

    from compiler import Snapshot

_log = logging.getLogger(__name__)

PINS_KEPT = 16
"""Pins of this many most recent batch ids survive pruning (Spark re-runs at most the last)."""
READ_ATTEMPTS = 5
"""A reader beside a running router lists the latest version again when it was pruned
between listing and reading (a newer one was saved meanwhile), at most this many times."""


@dataclass(frozen=True)
class SnapshotVersion:
    """One snapshot version: its bytes and what is recorded about it.

    ``reads_headers``: whether matching against it needs the publishes'
    headers (some live subscription has header criteria or No Local); when False the
    routing tasks do not build them.
    """

    version: int
    data: bytes
    reads_headers: bool

    @classmethod
    def of(cls, snapshot: Snapshot) -> SnapshotVersion:
        """The version of a compiled snapshot, with the facts read from its tables."""
        return cls(snapshot.version, snapshot.to_bytes(), _reads_headers(snapshot))

    def meta(self) -> dict[str, object]:
        """What the ``.meta`` file records."""
        return {"reads_headers": self.reads_headers}


def _reads_headers(snapshot: Snapshot) -> bool:
    """Some subscription has header criteria, or No Local (the ``publisher`` header)."""
    from compiler.options import SubscriptionOptions

    t = snapshot.tables
    return len(t.criteria_slots) > 0 or any(
        SubscriptionOptions.from_flags(bits).no_local for bits in t.option_flags.tolist())


class SnapshotFiles:
    """The snapshot versions and pins of a checkpoint folder, read only.

    Safe beside a running router: it creates, deletes and locks nothing, and a
    latest version pruned while it is read is looked up again.
    """

    def __init__(self, layout: CheckpointLayout) -> None:
        self.layout = layout

    def versions(self) -> list[int]:
        """The persisted versions, ascending (a version is its ``.snapshot`` file)."""
        try:
            names = os.listdir(self.layout.snapshots)
        except FileNotFoundError:
            return []
        found = (self.layout.snapshot_version(name) for name in names)
        return sorted(v for v in found if v is not None)

    def latest(self) -> SnapshotVersion | None:
        """The highest persisted version, or None when there is none."""
        for _ in range(READ_ATTEMPTS):
            versions = self.versions()
            if not versions:
                return None
            try:
                return self.load(versions[-1])
            except SnapshotStoreError:
                if versions[-1] in self.versions():
                    raise
        raise SnapshotStoreError(f"{self.layout.snapshots}: the latest snapshot kept disappearing "
                                 "while being read")

    def load(self, version: int) -> SnapshotVersion:
        """The persisted ``version``; raises :class:`SnapshotStoreError` when it is gone."""
        try:
            data = self.layout.snapshot_file(version).read_bytes()
        except FileNotFoundError:
            raise SnapshotStoreError(f"snapshot version {version} is not in "
                                     f"{self.layout.snapshots}") from None
        try:
            meta = json.loads(self.layout.meta_file(version).read_bytes())
            return SnapshotVersion(version, data, bool(meta["reads_headers"]))
        except FileNotFoundError:  # saved by an earlier build: the snapshot says it
            from compiler import Snapshot  # late: the compiler is slow to import

            return SnapshotVersion(version, data, _reads_headers(Snapshot.from_bytes(data)))
        except (ValueError, KeyError, TypeError) as exc:
            raise SnapshotStoreError(f"{self.layout.meta_file(version)} is unreadable: "
                                     f"{exc}") from None

    def changes(self, version: int) -> list[list]:
        """The changes (JSON arrays) that made ``version``."""
        path = self.layout.changes_file(version)
        try:
            return json.loads(path.read_bytes())
        except FileNotFoundError:
            raise SnapshotStoreError(f"snapshot version {version} is not in "
                                     f"{self.layout.snapshots}") from None
        except json.JSONDecodeError as exc:
            raise SnapshotStoreError(f"changes of snapshot version {version} are unreadable: "
                                     f"{exc}") from None

    def pinned(self, batch_id: int) -> int | None:
        """The version pinned for ``batch_id``, or None when the batch never started writing."""
        try:
            text = self.layout.pin_file(batch_id).read_text().strip()
        except FileNotFoundError:
            return None
        if not text.isdigit():
            raise SnapshotStoreError(f"pin of batch {batch_id} is unreadable: {text!r}")
        return int(text)

    def pinned_batches(self) -> list[int]:
        """The batch ids with a pin, ascending."""
        try:
            return sorted(int(name) for name in os.listdir(self.layout.pins) if name.isdigit())
        except FileNotFoundError:
            return []

    def has_pins(self) -> bool:
        return bool(self.pinned_batches())



def _stored_id(path: Path, make: Callable[[], str]) -> str:
    """The id in ``path``; ``make()``'s, written durably, when there is none yet."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        write_atomically(path, f"{make()}\n".encode())
        return path.read_text().strip()

class SnapshotStore(SnapshotFiles):
    """The router's snapshot versions and batch pins (module docstring): read and written.

    Used by one router process at a time (the router lock); not thread-safe.
    Its constructor creates the folders and deletes the temporary files a
    killed writer left, so only the lock holder may build one.
    """

    def __init__(self, layout: CheckpointLayout) -> None:
        super().__init__(layout)
        for folder in (layout.state, layout.snapshots, layout.pins):
            folder.mkdir(parents=True, exist_ok=True)
            for stale in folder.glob(".*.tmp"):  # left by a process killed mid-write
                stale.unlink(missing_ok=True)

    def router_id(self) -> str:
        """This router's identity, created at first use and stable across restarts.

        A fresh checkpoint folder is a fresh router: its Delta writes are not
        mistaken for re-runs of another router's batches.
        """
        return _stored_id(self.layout.router_id_file, lambda: uuid.uuid4().hex)

    def snapshot_audit_id(self) -> str:
        """The id the ``subscriptions`` audit of this folder's snapshot versions is keyed by
        (its Delta ``txn`` app id stem): the router id of the folder's first version. A new
        streaming checkpoint (:meth:`forget_batches`) keeps it, since the versions go on
        and are audited already; a restore (:meth:`renew_router_id`) takes the new id."""
        return _stored_id(self.layout.snapshot_audit_id_file, self.router_id)

    def save(self, snapshot: SnapshotVersion, changes: Sequence[Sequence]) -> None:
        """Persist ``snapshot`` (its changes and metadata first, then its bytes);
        overwrites nothing else."""
        write_atomically(self.layout.changes_file(snapshot.version),
                      json.dumps(changes, ensure_ascii=False).encode("utf-8"))
        write_atomically(self.layout.meta_file(snapshot.version), json.dumps(snapshot.meta()).encode())
        write_atomically(self.layout.snapshot_file(snapshot.version), snapshot.data)

    def pin(self, batch_id: int, version: int) -> None:
        """Record that ``batch_id`` uses ``version``; a batch's pin is written once."""
        path = self.layout.pin_file(batch_id)
        if path.exists():
            raise SnapshotStoreError(f"batch {batch_id} is pinned already (to {self.pinned(batch_id)})")
        write_atomically(path, f"{version}\n".encode())

    def renew_router_id(self) -> str:
        """Take a new router id (a restored state's, :mod:`streaming.router.restore`): the
        Delta ``txn`` versions of the old id are ahead of this folder's batches; return it.
        Its snapshot versions are audited under it too (they are renumbered)."""
        write_atomically(self.layout.router_id_file, f"{uuid.uuid4().hex}\n".encode())
        self.layout.snapshot_audit_id_file.unlink(missing_ok=True)
        return self.router_id()

    def forget_batches(self) -> None:
        """Drop every pin and take a new router id: the batch ids of a new
        streaming checkpoint start again at 0 and must not meet old pins, nor
        be mistaken by Delta for re-runs of the old batches. The snapshot versions
        stay, and so does the id their audit is keyed by (:meth:`snapshot_audit_id`):
        the latest version's changes are not audited twice."""
        self.snapshot_audit_id()  # fixed before the router id changes (an older folder)
        for batch_id in self.pinned_batches():
            self.layout.pin_file(batch_id).unlink(missing_ok=True)
        # A new router, not a restored one: no ancestors (streaming.router.restore).
        self.layout.lineage_file.unlink(missing_ok=True)
        write_atomically(self.layout.router_id_file, f"{uuid.uuid4().hex}\n".encode())

    def prune(self) -> None:
        """Drop pins older than the last :data:`PINS_KEPT` batches and every snapshot
        that is neither the latest nor pinned by a kept pin."""
        batches = self.pinned_batches()
        for batch_id in batches[:-PINS_KEPT]:
            self.layout.pin_file(batch_id).unlink(missing_ok=True)
        keep = {self.pinned(b) for b in batches[-PINS_KEPT:]}
        versions = self.versions()
        keep.update(versions[-1:])
        for version in versions:
            if version not in keep:
                # The snapshot goes first: a version without its snapshot file is no version.
                self.layout.snapshot_file(version).unlink(missing_ok=True)
                self.layout.changes_file(version).unlink(missing_ok=True)
                self.layout.meta_file(version).unlink(missing_ok=True)


@dataclass(frozen=True)
class BatchSnapshot:
    """The snapshot version one micro-batch routes with, as the batch's steps need it.

    ``broadcast`` holds the version's bytes for the executors and ``key`` names
    that broadcast in the workers' matcher cache
    (:func:`streaming.router.batch.matching.cached_matcher`); ``rerun``: the batch
    was pinned before (Spark runs it again after a crash).
    """

    batch_id: int
    version: int
    reads_headers: bool
    rerun: bool
    broadcast: Broadcast
    key: str


class BatchSnapshots:
    """The one owner of the snapshot version in the driver (module docstring).

    Not thread-safe: the router calls it from one batch at a time.
    """

    def __init__(self, store: SnapshotStore, context: SparkContext | None = None,
                 prune_at_commit: bool = False) -> None:
        self._store = store
        self._context = context
        self._prune_at_commit = prune_at_commit
        """Prune at each commit too (realtime mode: it pins no batch, and would keep every
        version, three files each, one per subscription change, for ever). Not in
        micro-batch mode: a restart's retained seeding reads the versions committed after
        the last pin (:meth:`streaming.router.retained.RetainedDeliveries.seed`), which the
        next batch's pin prunes."""
        self._current: SnapshotVersion | None = None
        self._live: tuple[int, Broadcast, str] | None = None
        self.commit_listeners: list[Callable[[Sequence[Sequence]], None]] = []
        """Each is called with the changes of every version committed, once persisted
        (:mod:`streaming.router.retained` notes the new subscriptions)."""

    @property
    def current(self) -> SnapshotVersion | None:
        """The latest persisted version (None before the first), kept in memory."""
        if self._current is None:
            self._current = self._store.latest()
        return self._current

    def committed(self) -> SnapshotVersion:
        """:attr:`current`, which exists once the router saved its first version (at start)."""
        current = self.current
        if current is None:
            raise RuntimeError("no snapshot version yet: the router saves its first one at start")
        return current

    def changes(self, version: int) -> list[list]:
        """The changes (JSON arrays) that made the persisted ``version``."""
        return self._store.changes(version)

    def commit(self, snapshot: SnapshotVersion, changes: Sequence[Sequence]) -> None:
        """Persist ``snapshot`` with the ``changes`` that made it and make it current, then,
        with ``prune_at_commit``, prune the versions no kept pin names
        (:meth:`SnapshotStore.prune`). If this raises, the current version is unchanged."""
        self._store.save(snapshot, changes)
        self._current = snapshot
        for listener in self.commit_listeners:
            listener(changes)
        if not self._prune_at_commit:
            return
        try:
            self._store.prune()
        except OSError as exc:  # housekeeping: the next commit or batch prunes again
            _log.warning(f"could not prune old snapshot versions: {exc}")

    def for_batch(self, batch_id: int, catch_up: Callable[[], object]) -> BatchSnapshot:
        """The version batch ``batch_id`` routes with, broadcast.

        A batch pinned before is a re-run and gets its pinned version. Any other
        first calls ``catch_up()``, which brings the changelog up to its end
        offsets and commits a new version when it read changes (happens-before),
        then pins the current version before anything of the batch is written.
        """
        version = self._store.pinned(batch_id)
        rerun = version is not None
        if version is None:
            catch_up()
        current = self.committed()
        if version is None:
            version = current.version
            self._store.pin(batch_id, version)
            self._store.prune()
        snapshot = current if version == current.version else self._store.load(version)
        broadcast, key = self._broadcast(snapshot)
        return BatchSnapshot(batch_id, version, snapshot.reads_headers, rerun, broadcast, key)

    def _broadcast(self, snapshot: SnapshotVersion) -> tuple[Broadcast, str]:
        """The live broadcast of ``snapshot``, made unless it is live already.

        The previous one is destroyed (which drops it from the Python workers
        too): the batch that used it is over (batches run one at a time), and a
        re-run broadcasts again.
        """
        if self._live is None or self._live[0] != snapshot.version:
            if self._context is None:
                raise RuntimeError("no SparkContext to broadcast snapshots with")
            broadcast = self._context.broadcast(snapshot.data)
            self.close()
            self._live = (snapshot.version, broadcast, uuid.uuid4().hex)
        return self._live[1], self._live[2]

    def close(self) -> None:
        """Destroy the live broadcast, if any."""
        if self._live is not None:
            self._live[1].destroy(blocking=False)
            self._live = None



