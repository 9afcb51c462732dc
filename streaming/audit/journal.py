"""The audit journal: each micro-batch's audit, durable on local disk until Delta has it.

The router's audit stage writes a batch's routed rows here and returns
(:meth:`AuditJournal.write`); the background committer
(:mod:`streaming.audit.committer`) appends the journaled batches to Delta in
groups and then removes them (:meth:`AuditJournal.remove`). So "the audit of
batch N is durable before Spark commits batch N" holds without a Delta commit
on the critical path.

Layout: ``<checkpoint_dir>/router/audit-journal/<batch id, 20 digits>.arrow``
(the folder: :attr:`streaming.state.checkpoint.CheckpointLayout.audit_journal`),
one Arrow IPC file per batch: for a batch routed in the driver, the
``ROUTED_PUBLISH`` rows the routing step returned (a :class:`PublishBatch`);
for a batch routed on the executors, the records of the audit files its tasks
wrote (a :class:`FileBatch`: a few hundred bytes per file, whatever the
batch's size); with the batch id, snapshot version and ``routed_at`` (and for
files, the publishes' count; and the publishes offsets the batch read from
and up to, when known) in the schema's metadata. A file is written under a temporary name, fsynced,
renamed, and the folder fsynced: a file with its final name is complete.
Temporary files left by a crash are deleted at open.

Thread-safe: the router writes, the committer reads and removes.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from pathlib import Path

import pyarrow as pa

from streaming.atomic import sync_folder, write_atomically
from streaming.audit.writer import AuditBatch, FileBatch, PublishBatch

_SUFFIX = ".arrow"
_FILES_OF = b"files_of_publishes"
"""Metadata key of a :class:`FileBatch`'s journal file: its publishes' count."""
_TMP_PREFIX = "."
_START = b"start_offsets"
_END = b"end_offsets"
"""Metadata keys of the publishes offsets a batch read from and up to (JSON, when known)."""


class AuditJournal:
    """The journal folder ``root``: batches written, listed, read and removed."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        for leftover in self.root.glob(f"{_TMP_PREFIX}*"):
            leftover.unlink(missing_ok=True)
        self._lock = threading.Lock()
        # batch id -> when it was journaled (epoch seconds), for the lag
        self._pending: dict[int, float] = {}
        for path in self.root.glob(f"*{_SUFFIX}"):
            self._pending[int(path.name[:-len(_SUFFIX)])] = path.stat().st_mtime

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    def __contains__(self, batch_id: int) -> bool:
        with self._lock:
            return batch_id in self._pending

    def pending(self) -> list[int]:
        """The journaled batch ids, in increasing order."""
        with self._lock:
            return sorted(self._pending)

    def oldest_age_s(self) -> float:
        """Seconds since the oldest pending batch was journaled; 0.0 when none is."""
        with self._lock:
            oldest = min(self._pending.values(), default=None)
        return 0.0 if oldest is None else max(0.0, time.time() - oldest)

    def write(self, batch: AuditBatch) -> None:
        """Make ``batch`` durable under its id (replacing a file of the same id)."""
        meta = {b"batch_id": str(batch.batch_id).encode(),
                b"snapshot_version": str(batch.snapshot_version).encode(),
                b"routed_at": batch.routed_at.isoformat().encode()}
        for key, offsets in ((_START, batch.start), (_END, batch.end)):
            if offsets is not None:
                meta[key] = json.dumps({str(p): o for p, o in offsets.items()}).encode()
        if isinstance(batch, FileBatch):
            meta[_FILES_OF] = str(batch.publishes).encode()
            table = batch.files.replace_schema_metadata(meta)
        else:
            table = batch.routed.replace_schema_metadata(meta)
        path = self._path(batch.batch_id)

        def write(file) -> None:
            with pa.ipc.new_file(file, table.schema) as writer:
                writer.write_table(table)

        write_atomically(path, write)
        with self._lock:
            self._pending[batch.batch_id] = time.time()

    def read(self, batch_id: int) -> AuditBatch:
        """The batch journaled under ``batch_id``."""
        with pa.OSFile(str(self._path(batch_id))) as source:  # read into memory, not mapped
            table = pa.ipc.open_file(source).read_all()
        meta = table.schema.metadata
        batch_id = int(meta[b"batch_id"])
        version = int(meta[b"snapshot_version"])
        routed_at = datetime.fromisoformat(meta[b"routed_at"].decode())
        start, end = (_offsets(meta.get(key)) for key in (_START, _END))
        if _FILES_OF in meta:
            return FileBatch(batch_id, version, routed_at, table.replace_schema_metadata(None),
                             int(meta[_FILES_OF]), start, end)
        return PublishBatch(batch_id=batch_id, snapshot_version=version, routed_at=routed_at,
                            routed=table.replace_schema_metadata(None), start=start, end=end)

    def remove(self, batch_ids: list[int]) -> None:
        """Forget ``batch_ids`` (their audit is in both tables)."""
        for batch_id in batch_ids:
            self._path(batch_id).unlink(missing_ok=True)
        sync_folder(self.root)
        with self._lock:
            for batch_id in batch_ids:
                self._pending.pop(batch_id, None)

    def _path(self, batch_id: int) -> Path:
        return self.root / f"{batch_id:020d}{_SUFFIX}"


def _offsets(text: bytes | None) -> dict[int, int] | None:
    """Offsets per partition journaled as JSON; None when absent (an earlier version's file)."""
    return None if text is None else {int(p): int(o) for p, o in json.loads(text).items()}
