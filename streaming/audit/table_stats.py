"""A Delta table's size now, read cheaply: its live data files, their bytes, the
entries of its ``_delta_log`` (listed in the folder, or on an object store with
obstore) and its version. ``bitroute status``, the metrics and the maintenance read it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pyarrow.compute as pc
from deltalake import DeltaTable

from streaming.audit.queries import arrow_table
from streaming.audit.storage import StorageOptions


@dataclass(frozen=True)
class TableStats:
    """A table's size now: live data files, their bytes, ``_delta_log`` entries, version."""

    files: int
    bytes: int
    log_entries: int | None
    version: int


def table_stats(table: DeltaTable | str, log_dir: Path | ObjectLog | None = None,
                storage: StorageOptions | None = None) -> TableStats:
    """Live data files, bytes, log entries (listed in the folder or with obstore; ``None``
    when they cannot be) and version.

    Reads the newest checkpoint and the commits after it (what delta-rs loads
    anyway) and lists ``_delta_log``: milliseconds on a maintained table.
    """
    if isinstance(table, str):
        log_dir = delta_log(table, storage or {})
        table = DeltaTable(table, storage_options=storage)
    sizes = arrow_table(table.get_add_actions(flatten=False).select(["size_bytes"]))["size_bytes"]
    entries = log_entries(log_dir)
    return TableStats(files=len(sizes), bytes=int(pc.sum(sizes).as_py() or 0),
                      log_entries=None if entries is None else len(entries),
                      version=table.version())


class ObjectLog:
    """A table's ``_delta_log`` on an object store, listed and read with obstore."""

    def __init__(self, uri: str, storage: Mapping[str, str]) -> None:
        from streaming.audit.storage import object_store_at

        self.store = object_store_at(uri, storage)

    def names(self) -> set[str]:
        import obstore

        listed = obstore.list(self.store)
        return {m["path"].rsplit("/", 1)[-1] for batch in listed for m in batch
                if "/" not in m["path"].strip("/")}

    def read(self, name: str) -> bytes:
        import obstore

        return bytes(obstore.get(self.store, name).bytes())


def delta_log(path: str, storage: Mapping[str, str]) -> Path | ObjectLog | None:
    """Where table ``path``'s log is listed: a folder, an object-store prefix, or None
    (a scheme obstore does not know)."""
    parsed = urlparse(path)
    if parsed.scheme in ("", "file") or len(parsed.scheme) == 1:  # a Windows drive letter
        return Path(parsed.path if parsed.scheme == "file" else path) / "_delta_log"
    try:
        return ObjectLog(f"{path.rstrip('/')}/_delta_log", storage)
    except Exception:  # noqa: BLE001 (sizes then say "?" for the log)
        return None


def log_entries(log_dir: Path | ObjectLog | None) -> set[str] | None:
    """Names in ``_delta_log`` (commits, checkpoints, ``_last_checkpoint``; not folders)."""
    if log_dir is None:
        return None
    if isinstance(log_dir, ObjectLog):
        try:
            return {n for n in log_dir.names() if not n.startswith(".")}
        except Exception:  # noqa: BLE001 (the sizes say "?" for the log)
            return None
    try:
        with os.scandir(log_dir) as entries:
            return {e.name for e in entries if e.is_file() and not e.name.startswith(".")}
    except FileNotFoundError:
        return set()


def last_checkpoint_version(log_dir: Path | ObjectLog | None) -> int | None:
    if log_dir is None:
        return None
    try:
        text = log_dir.read("_last_checkpoint") if isinstance(log_dir, ObjectLog) \
            else (log_dir / "_last_checkpoint").read_bytes()
        return int(json.loads(text)["version"])
    except Exception:  # noqa: BLE001 (none yet, or unreadable: a checkpoint is written)
        return None
