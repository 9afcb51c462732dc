"""One router per publishes topic and warehouse: a lease recorded with the audit tables.

The router lock (:mod:`streaming.state.lock`) keeps two routers off one
checkpoint folder; it cannot see a second router started with another
checkpoint folder on the same publishes topic and warehouse, which would route
every publish again and write the audit twice. The lease can: one object per
publishes topic under the warehouse,

    <delta.warehouse>/_bitroute/routers/<kafka.publishes_topic>.json

holding one JSON object ``{"router_id", "host", "pid", "checkpoint_dir",
"publishes_topic", "epoch", "acquired_at", "heartbeat_at", "released_at",
"timeout_s"}`` (times ISO-8601 UTC). Nothing secret is in it.

Rules (:meth:`RouterLease.acquire`, before the router writes or routes anything):

- no lease, or a released one: taken (``epoch`` + 1);
- a lease of the same router id (the same checkpoint folder:
  :meth:`streaming.router.subscriptions.snapshots.SnapshotStore.router_id`), from any host
  or path: taken over at once: a router restarted, or moved to another host
  with its checkpoint folder, carries on (the checkpoint folder's own lock
  already keeps two processes off one folder on one host);
- a lease of another router renewed within ``streaming.lease_timeout``:
  refused, :class:`LeaseHeldError`, one line naming the holder;
- a lease not renewed for longer than that (its router is gone): taken
  over, with a warning naming the previous holder.

Every write is a compare-and-swap (:mod:`streaming.audit.warehouse_objects`):
two routers starting at once cannot both win. While the router runs, a daemon thread renews the
lease every quarter of the timeout (``heartbeat_at``). A renewal that finds
the lease changed by someone else, or that has failed for longer than three
quarters of the timeout (before another router may take it over), marks the
lease lost: :meth:`RouterLease.check` then raises
:class:`LeaseLostError`, which ends the router's next batch before it routes.
:meth:`RouterLease.release` (the router's stop) records ``released_at`` so that
the next router need not wait.

Clocks: staleness compares the holder's ``heartbeat_at`` with the reader's
clock, so the hosts' clocks must agree to well within the timeout (NTP).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from streaming.audit.storage import StorageError, check_commit_safety
from streaming.audit.warehouse_objects import Conflict, WarehouseObject, location, warehouse_object
from streaming.config import Config
from streaming.errors import one_line
from streaming.state.errors import LeaseHeldError, LeaseLostError

_log = logging.getLogger(__name__)

LEASE_FOLDER = "routers"
"""The lease objects' folder, under ``<delta.warehouse>/_bitroute`` (:mod:`streaming.audit.warehouse_objects`)."""
CAS_ATTEMPTS = 5
"""Compare-and-swap attempts of one acquisition before giving up (each re-reads)."""


def lease_name(config: Config) -> str:
    return f"{config.kafka.publishes_topic}.json"


def lease_location(config: Config) -> str:
    return location(config.delta, LEASE_FOLDER, lease_name(config))


def _blob(config: Config) -> WarehouseObject:
    return warehouse_object(config.delta, LEASE_FOLDER, lease_name(config))


def read(config: Config) -> dict | None:
    """The lease of ``config``'s publishes topic and warehouse as recorded (None: none);
    for ``bitroute status``. Raises :class:`StorageError` when it cannot be read."""
    try:
        found = _blob(config).read()
    except StorageError:
        raise
    except Exception as exc:  # noqa: BLE001 (the store's own error types)
        raise StorageError(f"{lease_location(config)}: {one_line(exc)}") from None
    return _parse(found[0]) if found is not None else None


def ensure_free(config: Config) -> None:
    """Raise :class:`LeaseHeldError` while a router holds a fresh lease of ``config``'s
    publishes topic and warehouse (``bitroute audit migrate`` wants no router running, on
    any host)."""
    record = read(config)
    if record is None or record.get("released_at"):
        return
    age = age_seconds(record)
    if age is None or age <= config.streaming.lease_timeout_s:
        raise LeaseHeldError(f"{describe(record)} holds the lease of "
                             f"{config.kafka.publishes_topic} in {config.delta.warehouse}, "
                             f"renewed {'?' if age is None else f'{max(age, 0):.0f}s'} ago")


def describe(record: dict) -> str:
    """The holder as one phrase: ``router 1a2b... on host-3 (checkpoint /var/..., epoch 4)``."""
    return (f"router {record.get('router_id', '?')} on {record.get('host', '?')} "
            f"(pid {record.get('pid', '?')}, checkpoint {record.get('checkpoint_dir', '?')}, "
            f"epoch {record.get('epoch', '?')})")


def age_seconds(record: dict, now: datetime | None = None) -> float | None:
    """Seconds since the lease's last renewal (None when unreadable)."""
    try:
        beat = datetime.fromisoformat(str(record["heartbeat_at"]))
    except (KeyError, ValueError):
        return None
    return ((now or _now()) - beat).total_seconds()


@dataclass
class _Held:
    tag: str
    record: dict


class RouterLease:
    """The lease of one router: :meth:`acquire`, :meth:`check` per batch, :meth:`release`."""

    def __init__(self, config: Config, clock: Callable[[], datetime] | None = None) -> None:
        self.config = config
        self.timeout_s = config.streaming.lease_timeout_s
        self._clock = clock or _now
        self._held: _Held | None = None
        self._lost: str | None = None
        self._router_id: Callable[[], str] = lambda: "?"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def held(self) -> bool:
        return self._held is not None and self._lost is None

    @property
    def record(self) -> dict | None:
        return dict(self._held.record) if self._held is not None else None

    def acquire(self, router_id: Callable[[], str]) -> None:
        """Take the lease for the router whose id ``router_id()`` gives (asked again at
        every renewal: a router that starts a new checkpoint takes a new id), or raise
        :class:`LeaseHeldError`; then renew it in the background. Also proves the store's
        conditional writes (:func:`streaming.audit.storage.check_commit_safety`)."""
        check_commit_safety(self.config.delta)
        self._router_id = router_id
        try:
            blob = _blob(self.config)
            for _ in range(CAS_ATTEMPTS):
                try:
                    self._held = self._take(blob, blob.read())
                    break
                except Conflict:
                    continue  # another router wrote meanwhile: read again
            else:
                raise LeaseHeldError(f"the lease {lease_location(self.config)} kept changing "
                                     "while this router took it: is another router starting?")
        except (LeaseHeldError, StorageError):
            raise
        except Exception as exc:  # noqa: BLE001 (the store's own error types)
            raise StorageError(f"{lease_location(self.config)}: {one_line(exc)}") from None
        self._lost = None
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, args=(blob,),
                                        name="bitroute-router-lease", daemon=True)
        self._thread.start()

    def _take(self, blob: WarehouseObject, found: tuple[bytes, str] | None) -> _Held:
        me = self._router_id()
        previous = _parse(found[0]) if found is not None else None
        now = self._clock()
        if previous is not None and previous.get("router_id") != me \
                and not previous.get("released_at"):
            age = age_seconds(previous, now)
            if age is None or age <= self.timeout_s:
                raise LeaseHeldError(
                    f"another router routes {self.config.kafka.publishes_topic} into "
                    f"{self.config.delta.warehouse}: {describe(previous)}, renewed "
                    f"{'?' if age is None else f'{max(age, 0):.0f}s'} ago; stop it first (its "
                    f"lease is taken over once it is {self.timeout_s:g}s old: "
                    "streaming.lease_timeout)")
            _log.warning(f"taking over the router lease of {describe(previous)}: not renewed "
                         f"for {age:.0f}s (streaming.lease_timeout {self.timeout_s:g}s)")
        record = {
            "router_id": me, "host": socket.gethostname(), "pid": os.getpid(),
            "checkpoint_dir": str(self.config.streaming.checkpoint_dir),
            "publishes_topic": self.config.kafka.publishes_topic,
            "epoch": int((previous or {}).get("epoch", 0)) + 1,
            "acquired_at": _iso(now), "heartbeat_at": _iso(now), "released_at": None,
            "timeout_s": self.timeout_s,
        }
        data = _dump(record)
        tag = blob.create(data) if found is None else blob.replace(data, found[1])
        return _Held(tag, record)

    def check(self) -> None:
        """Raise :class:`LeaseLostError` once the lease is lost (a batch asks first)."""
        if self._lost is not None:
            raise LeaseLostError(self._lost)

    def renew(self, blob: WarehouseObject | None = None) -> None:
        """Write a new ``heartbeat_at`` (the background thread does, every quarter of the
        timeout); marks the lease lost when someone else changed it."""
        with self._lock:
            held = self._held
            if held is None or self._lost is not None:
                return
            record = {**held.record, "router_id": self._router_id(),
                      "heartbeat_at": _iso(self._clock())}
            try:
                tag = (blob or _blob(self.config)).replace(_dump(record), held.tag)
            except Conflict:
                found = read(self.config)
                self._lost = (f"this router's lease {lease_location(self.config)} was taken "
                              f"over by {describe(found) if found else 'nobody (deleted)'}: "
                              "stopping, another router routes this topic now")
                _log.error(self._lost)
                return
            self._held = _Held(tag, record)

    def _renew_loop(self, blob: WarehouseObject) -> None:
        interval = max(0.5, self.timeout_s / 4)
        last_ok = time.monotonic()
        while not self._stop.wait(interval):
            try:
                self.renew(blob)
                last_ok = time.monotonic()
            except Exception as exc:  # noqa: BLE001 (retried; lost past the timeout)
                failing = time.monotonic() - last_ok
                _log.warning(f"renewing the router lease failed ({one_line(exc)}); retrying")
                if failing > self.timeout_s * 0.75:
                    self._lost = (f"the router lease {lease_location(self.config)} could not "
                                  f"be renewed for {failing:.0f}s: stopping before another "
                                  "router takes it over")
                    _log.error(self._lost)
            if self._lost is not None:
                return

    def release(self) -> None:
        """Stop renewing and record the lease released (when it is still this router's)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(5)
        with self._lock:
            held, self._held = self._held, None
            if held is None or self._lost is not None:
                return
            record = {**held.record, "released_at": _iso(self._clock())}
            try:
                _blob(self.config).replace(_dump(record), held.tag)
            except Conflict:
                pass  # taken over meanwhile: nothing of ours to release
            except Exception as exc:  # noqa: BLE001 (goes stale by itself)
                _log.warning(f"releasing the router lease failed ({one_line(exc)}); it is "
                             f"taken over once {self.timeout_s:g}s old")


def _parse(data: bytes) -> dict | None:
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _dump(record: dict) -> bytes:
    return (json.dumps(record, sort_keys=True) + "\n").encode()


def _now() -> datetime:
    return datetime.now(UTC)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds")
