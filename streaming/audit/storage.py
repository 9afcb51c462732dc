"""Where the audit tables' files live: the warehouse as a filesystem, for every writer.

``delta.warehouse`` is a local folder or an object-store URI. delta-rs opens the
tables itself (``DeltaTable(uri, storage_options=...)``); files written outside
delta-rs (the routing tasks' audit files, committed later by the driver) go
through :func:`warehouse_filesystem`, so both reach the same objects with the
same credentials, which come from the environment only.
"""

from __future__ import annotations

from pyarrow import fs

from streaming.config import DeltaConfig


def warehouse_filesystem(delta: DeltaConfig) -> tuple[fs.FileSystem, str]:
    """The filesystem holding ``delta.warehouse`` and the warehouse's path inside it
    (no trailing slash). A plain path is the local filesystem (made absolute)."""
    filesystem, path = fs.FileSystem.from_uri(_uri(delta.warehouse))
    return filesystem, path.rstrip("/")


def _uri(warehouse: str) -> str:
    if "://" in warehouse:
        return warehouse
    from pathlib import Path
    return Path(warehouse).absolute().as_uri()
