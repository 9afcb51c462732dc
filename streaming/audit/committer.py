"""The background committer: journaled batches group-committed to the Delta audit tables.

The router's audit stage hands each batch to :meth:`AuditCommitter.submit`,
which writes it to the journal (:mod:`streaming.audit.journal`) and returns;
a thread appends every pending batch to ``messages`` and ``deliveries`` in
rounds at least ``audit.commit_interval`` apart: a batch journaled when the
last round is that old is committed at once, under steady traffic the
batches of an interval go together (a round commits what was pending when it
began; what arrives during it waits for the next) (:meth:`streaming.audit.writer.AuditTables.append_publishes`:
one transaction per table for the whole group, its ``txn`` version the
group's highest batch id) and only then removes the batches from the journal.

Invariants:

- A batch is durable (journaled) before ``submit`` returns, so before Spark
  commits it; it leaves the journal only once both tables hold it.
- Exactly once: a batch id committed to both tables, or already journaled, is
  not journaled again (a re-run); each table skips the batches at or below its
  committed ``txn`` version, so a crash between the two tables' commits, or
  after both but before the journal removal, adds no row twice.
- Bounded: while ``audit.max_pending_batches`` batches wait, ``submit`` waits
  (back-pressure; logged once per episode).
- An audit row lands within ``audit.commit_interval`` (plus the commit's own
  time) of its batch while Delta is reachable. A failing commit (``DeltaError``,
  ``OSError``) is retried with :mod:`streaming.retry`'s backoff and reporting (0.5 s doubling
  to 30 s, logged at its first failure, then at most every 30 s, then at its recovery).

Call :meth:`recover` before routing starts (it commits what a crash left in
the journal), then :meth:`start`; :meth:`flush` commits now and waits;
:meth:`stop` flushes (bounded) and ends the thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from deltalake.exceptions import DeltaError

from streaming.audit.errors import AuditStopping
from streaming.audit.journal import AuditJournal
from streaming.audit.writer import MAX_COMMIT_ROWS, PUBLISH_TABLES, AuditBatch, AuditTables
from streaming.errors import one_line
from streaming.retry import BACKOFF, RetryAbandoned, retry

_log = logging.getLogger(__name__)

RETRIED_ERRORS = (DeltaError, OSError)
"""Commit failures retried with :func:`streaming.retry.retry` (Delta or the disk unreachable)."""
STOP_FLUSH_TIMEOUT_S = 60.0
"""How long a stopping router waits for the pending audit to reach Delta; what is left
stays in the journal and is committed at the next start."""


class AuditCommitter:
    """Journals batches and commits them to ``tables`` in the background (module docstring).

    ``stopping`` is the router's stop request: it ends a back-pressure wait.
    ``on_commit`` is called (from the committer's thread) after each commit round.
    """

    def __init__(self, tables: AuditTables, journal: AuditJournal, interval_s: float,
                 max_pending: int, stopping: threading.Event | None = None,
                 on_commit: Callable[[], None] | None = None) -> None:
        self.tables = tables
        self.journal = journal
        self.interval_s = interval_s
        self.max_pending = max_pending
        self.on_commit = on_commit
        self._stopping = stopping or threading.Event()
        self._done = threading.Event()
        self._changed = threading.Condition()
        self._flush_wanted = False
        self._last_round = float("-inf")
        """When the last commit round started (monotonic): rounds start at least
        ``interval_s`` apart, so the tables gain at most one commit per interval."""
        self._thread: threading.Thread | None = None
        self._committed_through: int | None = None

    @property
    def pending_batches(self) -> int:
        """Batches journaled and not yet in both tables."""
        return len(self.journal)

    @property
    def lag_seconds(self) -> float:
        """Age of the oldest pending batch (0.0 when none is)."""
        return self.journal.oldest_age_s()

    def recover(self) -> None:
        """Commit what the journal holds (a crash's leftovers), retrying, before routing starts."""
        self._committed_through = self._both_committed()
        if len(self.journal):
            _log.info(f"committing {len(self.journal)} journaled audit batches left by the "
                      "last run")
        self._commit_retrying(give_up=self._stopping.is_set)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="bitroute-audit-committer",
                                            daemon=True)
            self._thread.start()

    def submit(self, batch: AuditBatch) -> bool:
        """Journal ``batch`` (durable on return); False when it is a re-run (journaled or
        committed already). Waits while the journal is full; raises :class:`AuditStopping`
        if the router stops meanwhile."""
        if self._committed_through is not None and batch.batch_id <= self._committed_through:
            return False
        if batch.batch_id in self.journal:
            return False
        self._wait_for_room(batch.batch_id)
        self.journal.write(batch)
        with self._changed:
            self._changed.notify_all()
        return True

    def flush(self, timeout: float | None = None) -> bool:
        """Commit every pending batch now; True when the journal is empty within ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            self._flush_wanted = True
            self._changed.notify_all()
        if self._thread is None or not self._thread.is_alive():
            self._commit_retrying(give_up=lambda: deadline is not None
                                  and time.monotonic() >= deadline)
            return not len(self.journal)
        with self._changed:
            return self._changed.wait_for(lambda: not len(self.journal),
                                          None if deadline is None
                                          else max(0.0, deadline - time.monotonic()))

    def stop(self, timeout: float = STOP_FLUSH_TIMEOUT_S) -> None:
        """Flush (waiting at most ``timeout``), then end the thread. Pending batches that did
        not make it stay in the journal for the next start."""
        if self._thread is None:
            return
        if not self.flush(timeout) and len(self.journal):
            _log.warning(f"{len(self.journal)} audit batches left in the journal; they are "
                         "committed at the next start")
        self._done.set()
        with self._changed:
            self._changed.notify_all()
        self._thread.join(timeout=BACKOFF.cap_s)  # a commit round in progress ends
        self._thread = None

    def _wait_for_room(self, batch_id: int) -> None:
        with self._changed:
            if len(self.journal) < self.max_pending:
                return
            _log.warning(f"batch {batch_id}: {len(self.journal)} audit batches wait for Delta "
                         f"(audit.max_pending_batches = {self.max_pending}); the batch waits")
            self._flush_wanted = True
            self._changed.notify_all()
            while len(self.journal) >= self.max_pending:
                if self._stopping.is_set() or self._done.is_set():
                    raise AuditStopping(f"batch {batch_id} left for a re-run: the router is "
                                        "stopping while the audit journal is full")
                self._changed.wait(0.2)

    def _run(self) -> None:
        while not self._done.is_set():
            with self._changed:
                self._changed.wait_for(lambda: self._flush_wanted or self._done.is_set()
                                       or len(self.journal) > 0, self.interval_s)
                # Rounds at least interval_s apart, unless a flush is wanted.
                self._changed.wait_for(
                    lambda: self._flush_wanted or self._done.is_set(),
                    max(0.0, self._last_round + self.interval_s - time.monotonic()))
                flush, self._flush_wanted = self._flush_wanted, False
            if self._done.is_set():
                break
            pending = self.journal.pending()
            if pending:
                self._last_round = time.monotonic()
                # Only what is pending now: batches journaled during this round's
                # commit wait for the next round (else steady traffic would chain
                # rounds back to back: a commit per batch).
                self._commit_retrying(give_up=self._done.is_set,
                                      through=None if flush else pending[-1])

    def _commit_retrying(self, give_up: Callable[[], bool], through: int | None = None) -> None:
        """Commit rounds until no batch at or below ``through`` (None: none at all) is pending,
        retrying failures with backoff until ``give_up()`` is true."""
        while self._pending_through(through):
            try:
                retry(lambda: self._commit_round(through), retried=RETRIED_ERRORS, log=_log,
                      what=lambda: f"the audit commit of {len(self.journal)} pending batches",
                      give_up=give_up, wake=self._done,
                      describe=lambda exc: one_line(exc, typed=True))
            except RetryAbandoned:
                return
            with self._changed:
                self._changed.notify_all()
            if self.on_commit is not None:
                self.on_commit()

    def _pending_through(self, through: int | None) -> bool:
        pending = self.journal.pending()
        return bool(pending) and (through is None or pending[0] <= through)

    def _commit_round(self, through: int | None = None) -> None:
        """Commit the oldest pending batches at or below ``through`` (at most about
        :data:`MAX_COMMIT_ROWS` publishes, at least one batch) to both tables, then drop them
        from the journal."""
        ids = [i for i in self.journal.pending() if through is None or i <= through]
        done = [i for i in ids if self._committed_through is not None
                and i <= self._committed_through]
        if done:  # committed to both tables before a crash, not yet removed
            self.journal.remove(done)
            ids = ids[len(done):]
        batches: list[AuditBatch] = []
        rows = 0
        for batch_id in ids:
            batch = self.journal.read(batch_id)
            if batches and rows + batch.publishes > MAX_COMMIT_ROWS:
                break
            batches.append(batch)
            rows += batch.publishes
        if not batches:
            return
        self.tables.append_publishes(batches)
        self.journal.remove([b.batch_id for b in batches])
        self._committed_through = batches[-1].batch_id

    def _both_committed(self) -> int | None:
        versions = [self.tables.publishes_version(name) for name in PUBLISH_TABLES]
        known = [v for v in versions if v is not None]
        return min(known) if len(known) == len(versions) else None
