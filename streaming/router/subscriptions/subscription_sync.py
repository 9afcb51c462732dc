"""Writing what each new subscription version implies, in the order that makes a crash safe.

:class:`streaming.router.subscriptions.changelog.Subscriptions` is the subscription state alone:
its catch-up returns a pending version (the changes, the rejected records,
the offsets). :meth:`SubscriptionSync.catch_up` makes that version current
only after, in this order:

1. its rejected records are in the rejected topic (at least once);
2. each new subscriber's delivery topic exists;
3. the version is persisted (:meth:`~streaming.router.subscriptions.changelog.Subscriptions.commit`
   hands it to :class:`~streaming.router.subscriptions.snapshots.BatchSnapshots`);

and then appends its changes to Delta ``subscriptions`` (exactly once, keyed
by the version) before returning it. A failure before 3 rolls the state back
to the current version, so the next catch-up re-reads the records and writes
1 and 2 again; a failure at the append leaves the version current and the
append is retried by the next catch-up. A restart (:meth:`SubscriptionSync.open`)
resumes from the latest persisted version and re-appends its changes
idempotently, so a crash at any point loses no change and no audit row.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

import pyarrow as pa

from schemas.records import SOURCE_SUBSCRIPTION, message_id
from schemas.tables import SUBSCRIPTIONS_TABLE, arrow_schema, utc_date
from streaming.audit.writer import AuditTables
from streaming.config import Config
from streaming.kafka.clients import OnError
from streaming.kafka.records import kept_headers
from streaming.kafka.topics import admin_client, ensure_delivery_topics
from streaming.router.batch.delivery import DeliveryUnavailable, ProducerSettings, cached_producer
from streaming.router.batch.rejected import BadRecord, write_rejected
from streaming.router.subscriptions.changelog import (
    Change,
    ChangelogError,
    PendingVersion,
    RejectedRecord,
    Subscriptions,
)
from streaming.router.subscriptions.snapshots import BatchSnapshots

_log = logging.getLogger(__name__)

_SUBSCRIPTIONS_ARROW = arrow_schema(SUBSCRIPTIONS_TABLE)


def changes_table(changes: Sequence[Change], version: int) -> pa.Table:
    """``changes`` as the Arrow form of ``SUBSCRIPTIONS_TABLE``, all made by ``version``.

    Columnar, so that the changes of a whole changelog (millions at a
    first start) reach Delta without a Python object per cell.
    """
    # Not strict: a version persisted before a field existed has fewer columns (or none).
    columns = dict(zip(Change._fields, zip(*changes, strict=True), strict=False))
    for name in Change._fields:
        columns.setdefault(name, (None,) * len(changes))
    arrays = []
    for field in _SUBSCRIPTIONS_ARROW:
        if field.name == "snapshot_version":
            arrays.append(pa.array([version] * len(changes), field.type))
        elif field.name in ("changed_at", "applied_at"):
            millis = pa.array(columns[f"{field.name}_ms"], pa.timestamp("ms", tz="UTC"))
            arrays.append(millis.cast(field.type))
        elif field.name == "applied_date":
            arrays.append(utc_date(arrays[_SUBSCRIPTIONS_ARROW.get_field_index("applied_at")]))
        else:
            arrays.append(pa.array(columns[field.name], field.type))
    return pa.Table.from_arrays(arrays, schema=_SUBSCRIPTIONS_ARROW)


class SubscriptionSync:
    """The subscription state and the writes its versions imply (module docstring).

    Build with :meth:`open`. :attr:`subscriptions` is the state, for reading;
    catch it up through :meth:`catch_up` only. Not thread-safe: the router
    calls it from one batch at a time.
    """

    def __init__(self, config: Config, subscriptions: Subscriptions, audit: AuditTables,
                 on_error: OnError | None = None) -> None:
        self.subscriptions = subscriptions
        self._config = config
        self._audit = audit
        self._admin = admin_client(config, on_error)
        self._topics_ensured: set[str] = set()
        self._unaudited: tuple[int, pa.Table] | None = None
        self.on_version: Callable[[PendingVersion], None] | None = None
        """Called with each pending version before it is persisted (after its rejected
        records and delivery topics): the replays' durable record of what it asks for
        (:meth:`streaming.router.replay.replay.Replays.requested`); raising rolls the version back."""
        self.on_committed: Callable[[int, dict[int, int]], None] | None = None
        """Called with each version and the changelog offsets it covers once it is persisted,
        before its Delta ``subscriptions`` append: realtime mode's routing view, which must
        not wait for Delta (:mod:`streaming.realtime.view`). It must not raise."""

    @classmethod
    def open(cls, config: Config, snapshots: BatchSnapshots, audit: AuditTables,
             on_error: OnError | None = None) -> SubscriptionSync:
        """Open the state at the latest persisted version
        (:meth:`Subscriptions.open`) and re-append that version's changes to Delta
        (a no-op when they are there already). Call :meth:`catch_up` next."""
        subscriptions, changes = Subscriptions.open(config, snapshots, on_error)
        try:
            if changes:
                version = subscriptions.version
                audit.append_subscriptions(version, changes_table(changes, version))
        except BaseException:
            subscriptions.close()
            raise
        return cls(config, subscriptions, audit, on_error)

    def catch_up(self, progress: Callable[[int, int], None] | None = None) -> int:
        """Apply the changelog up to its current end offsets and write what the new
        version implies (module docstring); return the current version.

        ``progress`` is passed to
        :meth:`streaming.router.subscriptions.changelog.ChangelogReader.read_to_end`.
        """
        if self._unaudited is not None:
            self._audit.append_subscriptions(*self._unaudited)
            self._unaudited = None
        pending = self.subscriptions.catch_up(progress)
        if pending is None:
            return self.subscriptions.version
        try:
            self._report_rejected(pending.rejected)
            self._ensure_delivery_topics(pending.subscribers())
            if self.on_version is not None:
                self.on_version(pending)
            self.subscriptions.commit(pending)
        except BaseException:
            self.subscriptions.rollback()
            raise
        # Committed: from here the version stands, and a failed audit append
        # is retried by the next catch-up (or by open() after a restart).
        self._unaudited = (pending.version, changes_table(pending.changes, pending.version))
        if self.on_committed is not None:
            self.on_committed(pending.version, dict(pending.offsets))
        self._audit.append_subscriptions(*self._unaudited)
        self._unaudited = None
        return pending.version

    def close(self) -> None:
        self.subscriptions.close()

    def _ensure_delivery_topics(self, subscribers: Iterable[str]) -> None:
        """Create the delivery topics of ``subscribers`` not created by this process yet."""
        new = sorted(set(subscribers) - self._topics_ensured)
        ensure_delivery_topics(self._config, new, admin=self._admin)
        self._topics_ensured.update(new)

    def _report_rejected(self, rejected: Sequence[RejectedRecord]) -> None:
        """Send each bad change to the rejected topic and wait for Kafka's acks, with the
        rejected topic's one writer and failure policy (:mod:`streaming.router.batch.rejected`):
        a copy Kafka refuses is left out with a warning (its ``subscriptions`` audit row
        holds the reason); any other failure raises
        :class:`~streaming.router.subscriptions.changelog.ChangelogError` (the batch retries).
        """
        if not rejected:
            return
        kafka = self._config.kafka
        try:
            # The routing process's producer (made at the first bad change, if ever).
            producer = cached_producer(ProducerSettings.of(kafka))
            _, refused = write_rejected(producer, kafka.rejected_topic, [
                BadRecord(r.key, r.value, kept_headers(r.headers), r.reason, SOURCE_SUBSCRIPTION,
                          message_id(r.topic, r.partition, r.offset)) for r in rejected],
                kafka.max_delivery_bytes)
        except DeliveryUnavailable as exc:
            raise ChangelogError(f"could not write {len(rejected)} rejected subscription changes "
                                 f"to {kafka.rejected_topic!r}: {exc}") from None
        if refused:
            _log.warning(f"{len(refused)} rejected subscription changes were refused by "
                         f"{self._config.kafka.rejected_topic!r} ({refused[0]}); their reasons "
                         "are in the subscriptions audit table")
