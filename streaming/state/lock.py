"""One router per state folder: an exclusive lock on ``<checkpoint_dir>/router.lock``.

Two routers on one checkpoint would run two streaming queries over the same
offsets and pins. :class:`RouterLock` is an ``fcntl.flock`` held for the
router's lifetime: the kernel drops it when the last process holding the
open file ends, however it ends, so a crash cannot leave it stale. The file
names its holder as one JSON object ``{"pid", "host", "started_at"}``
(``started_at`` ISO-8601 UTC; ``jvm_pid``, the Spark JVM's, added once it is
known), which :func:`holder` reads and the refusal message quotes.

The router hands the lock's file descriptor to its JVM watchdog
(:mod:`streaming.state.watchdog`), so the folder stays locked until the Spark JVM
of a killed router is gone too: a held lock whose ``pid`` has exited is a
router stopping, not running (:func:`driver_alive`).

A lock on a local path: the checkpoint folder must be on a local disk (or
one where ``flock`` works across the processes that can reach it).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from datetime import UTC, datetime
from pathlib import Path

from streaming.process import pid_alive
from streaming.state.checkpoint import CheckpointLayout
from streaming.state.errors import RouterLockedError

LOCK_WAIT_S = 10.0
"""How long a starting router waits for the lock before refusing to start."""


def holder(checkpoint_dir: str | Path) -> dict | None:
    """The holder ``{"pid", "host", "started_at"}`` while a router holds the lock (``{}``
    for a moment while it starts), else None."""
    path = CheckpointLayout.of(checkpoint_dir).lock_file
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read(fd) or {}  # held; {} while its holder has not written its name yet
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def driver_alive(record: dict) -> bool | None:
    """Whether the holder's driver process still runs: None when that cannot be told
    (another host, or no pid recorded yet)."""
    pid = record.get("pid")
    if not isinstance(pid, int) or record.get("host") != socket.gethostname():
        return None
    return pid_alive(pid)


class RouterLock:
    """The exclusive lock of one checkpoint folder; ``acquire()`` or raise, ``release()``."""

    def __init__(self, checkpoint_dir: str | Path) -> None:
        self.path = CheckpointLayout.of(checkpoint_dir).lock_file
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock (between :meth:`acquire` and :meth:`release`)."""
        return self._fd is not None

    @property
    def fd(self) -> int:
        """The open, locked descriptor (to pass to a process that must keep the lock)."""
        if self._fd is None:
            raise RuntimeError("the router lock is not held")
        return self._fd

    def acquire(self, wait_s: float = LOCK_WAIT_S) -> None:
        """Take the lock, waiting up to ``wait_s`` for a holder that is ending (a killed
        router's JVM takes a moment to go), else raise :class:`RouterLockedError`
        naming the process that has it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
            other = _read(fd) or {}
            os.close(fd)
            raise RouterLockedError(
                f"another router holds {self.path.parent} (pid {other.get('pid', '?')} on "
                f"{other.get('host', '?')}, since {other.get('started_at', '?')}): stop it "
                "first, or give this one another streaming.checkpoint_dir") from None
        me = {"pid": os.getpid(), "host": socket.gethostname(),
              "started_at": datetime.now(UTC).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        self._fd = fd

    def note(self, **fields: object) -> None:
        """Add ``fields`` to the holder's record (e.g. ``jvm_pid``, once the JVM is known)."""
        record = {**(_read(self.fd) or {}), **fields}
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, (json.dumps(record) + "\n").encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None

    def __enter__(self) -> RouterLock:
        self.acquire()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


def _read(fd: int) -> dict | None:
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", errors="replace").strip()
        value = json.loads(text) if text else None
    except (OSError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None
