"""The one way bitroute replaces a local file: whole or not at all, durably.

:func:`write_atomically` writes a temporary file beside the target (its name
starts with ``.`` and ends with ``.tmp``, so a folder's readers and cleaners
can skip or delete leftovers), fsyncs it, renames it over the target, and
fsyncs the folder: after a crash of the process or the machine, the target
holds either its old content or the new one, never a part. Used for the
snapshots and pins, the audit journal, the lease file, ``status.json`` and
``maintenance.json``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

Content = bytes | str | Callable[[BinaryIO], object]
"""What to write: bytes, text (UTF-8), or a function writing to the open binary file."""


def write_atomically(path: Path | str, content: Content, *, durable: bool = True) -> None:
    """Replace ``path`` with ``content`` atomically (module docstring).

    ``durable=False`` skips both fsyncs: the replacement is still atomic for readers,
    but a machine crash may lose it (files rewritten every batch whose loss costs
    nothing, like ``status.json``). The temporary file is removed when writing fails.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            if isinstance(content, str):
                handle.write(content.encode("utf-8"))
            elif isinstance(content, bytes):
                handle.write(content)
            else:
                content(handle)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        sync_folder(path.parent)


def sync_folder(folder: Path | str) -> None:
    """fsync ``folder``, so the names created, renamed or deleted in it survive a machine crash."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
