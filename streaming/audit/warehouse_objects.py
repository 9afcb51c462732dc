"""Small JSON objects the router keeps beside the audit tables, replaced by compare-and-swap.

``<delta.warehouse>/_bitroute/<folder>/<name>``: the router lease
(:mod:`streaming.state.lease`) and the publishes topics' incarnations
(:mod:`streaming.router.topics.incarnations`). They live with the audit, not in a
router's state folder, because they hold for every router writing that
warehouse.

Every write is a compare-and-swap: on an object store a conditional put
(``If-None-Match: *`` to create, ``If-Match: <etag>`` to replace, through
obstore, with the credentials of :func:`streaming.audit.storage.storage_options`);
on a local or mounted folder an ``flock`` on ``<name>.lock`` around reading
and replacing (a temporary file, fsync, rename). Two writers racing cannot
both win: the loser gets :class:`Conflict` and reads again.
"""

from __future__ import annotations

import fcntl
import hashlib
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from streaming.atomic import write_atomically
from streaming.audit.errors import Conflict
from streaming.audit.storage import is_object_store, object_store
from streaming.config import DeltaConfig

ROOT = "_bitroute"
"""The objects' folder under ``delta.warehouse``."""


class WarehouseObject(Protocol):
    """One object: its bytes and a tag (an etag, or a digest) that a replace must name."""

    def read(self) -> tuple[bytes, str] | None:
        """The object and its tag; None when there is none."""

    def create(self, data: bytes) -> str:
        """Write a new object; raises :class:`Conflict` when one exists. Returns its tag."""

    def replace(self, data: bytes, tag: str) -> str:
        """Replace the object read with ``tag``; raises :class:`Conflict` when it changed."""


def warehouse_object(delta: DeltaConfig, folder: str, name: str) -> WarehouseObject:
    """The object ``<delta.warehouse>/_bitroute/<folder>/<name>``."""
    if is_object_store(delta):
        return _StoreObject(delta, f"{ROOT}/{folder}", name)
    return _FileObject(delta, f"{ROOT}/{folder}", name)


def location(delta: DeltaConfig, folder: str, name: str) -> str:
    """Where :func:`warehouse_object` keeps the object, for messages."""
    return f"{delta.warehouse.rstrip('/')}/{ROOT}/{folder}/{name}"


class _StoreObject:
    """An object of an object store, swapped with conditional puts (obstore)."""

    def __init__(self, delta: DeltaConfig, folder: str, name: str) -> None:
        self._store = object_store(delta, folder)
        self._name = name

    def read(self) -> tuple[bytes, str] | None:
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            got = obstore.get(self._store, self._name)
        except (NotFoundError, FileNotFoundError):  # obstore raises the latter
            return None
        return bytes(got.bytes()), _tag(got.meta["e_tag"])

    def create(self, data: bytes) -> str:
        import obstore
        from obstore.exceptions import AlreadyExistsError

        try:
            return _tag(obstore.put(self._store, self._name, data, mode="create")["e_tag"])
        except AlreadyExistsError:
            raise Conflict from None

    def replace(self, data: bytes, tag: str) -> str:
        import obstore
        from obstore.exceptions import NotFoundError, PreconditionError

        try:
            return _tag(obstore.put(self._store, self._name, data, mode={"e_tag": tag})["e_tag"])
        except (PreconditionError, NotFoundError, FileNotFoundError):
            raise Conflict from None


class _FileObject:
    """A local (or mounted) file, swapped under an ``flock``."""

    def __init__(self, delta: DeltaConfig, folder: str, name: str) -> None:
        warehouse = delta.warehouse
        if warehouse.startswith("file://"):
            warehouse = urlparse(warehouse).path
        self.path = Path(warehouse) / folder / name

    def read(self) -> tuple[bytes, str] | None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        return data, hashlib.sha256(data).hexdigest()

    def create(self, data: bytes) -> str:
        return self._swap(data, None)

    def replace(self, data: bytes, tag: str) -> str:
        return self._swap(data, tag)

    def _swap(self, data: bytes, tag: str | None) -> str:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            current = self.read()
            if (current[1] if current is not None else None) != tag:
                raise Conflict
            write_atomically(self.path, data)
        return hashlib.sha256(data).hexdigest()


def _tag(e_tag: str | None) -> str:
    """An object's ETag, which the compare-and-swaps need (a store without one cannot hold them)."""
    if e_tag is None:
        raise OSError("the object store returned no ETag: its conditional writes are unusable")
    return e_tag
