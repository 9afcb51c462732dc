"""Realtime mode's queries kept running: a failed query started again from its checkpoint.

Real-Time Mode does not retry a task: a lost executor or a Kafka
client that gives up (a broker away past the producer's ``delivery.timeout.ms`` with
deliveries in flight) fails the routing query as a whole. (A single broker's restart
of a minute or two is waited out by Kafka's clients: docs/reliability.md.) In micro-batch mode
the same faults fail a batch's step, which the router retries with backoff
(:mod:`streaming.retry`); here the router does the same one level up: each of
realtime mode's queries (the routing query, the audit query) has a
:class:`QuerySupervisor`, a background worker (:class:`streaming.worker.Worker`: its
start, its stop with the router's, its backoff and lines) that, when its query fails,
starts it again from its checkpoint, with :data:`streaming.retry.BACKOFF` between
attempts and its reporting (:class:`streaming.retry.Failures`): one line at the
failure, then at most every 30 s while restarts keep failing, one line at the
recovery. Restarting from the checkpoint is what the mode's guarantees
are built on: the routing query routes again what its last checkpoint did not
cover (deliveries at least once, with their message ids), and the audit leaves
those repeats out (:mod:`streaming.realtime.audit`).

An attempt has *recovered* once the restarted query has run :func:`recovery_s`
seconds (two checkpoint intervals) without failing: a query started against a
broker that is still down is accepted by Spark and fails later, and that is the
same outage, not a recovery.

Every failure of a query is restarted, Kafka refusing access included: its line
names what to grant (:meth:`streaming.router.service.Router.failure_line`), and the
router routes again once the grant lands, as micro-batch mode's ``bitroute run``
does. Three ends are not restarts, and :meth:`QuerySupervisor.ended` says them: the
Spark JVM gone (nothing left to restart in), a query stopped from outside the
router (someone meant it), and a retention gap met by a restart under
``streaming.on_retention_gap = "stop"`` (:mod:`streaming.realtime.retention`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from py4j.protocol import Py4JError, Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql.streaming import StreamingQuery

from streaming.errors import RetryAbandoned, one_line
from streaming.retry import BACKOFF, Backoff
from streaming.router.errors import RetentionGapError
from streaming.worker import Worker

_log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 1.0
"""How often a supervisor looks at its query."""
RESTARTED_ERRORS = (PySparkException, Py4JJavaError)
"""What a failed query (``StreamingQueryException``) or a refused start (a JVM exception)
raises: restarted. Any other py4j error means the JVM is gone."""
JVM_GONE = ("the Spark JVM ended unexpectedly; start the router again (each query resumes "
            "from its checkpoint)")


def recovery_s(checkpoint_interval_s: float) -> float:
    """How long a restarted query must run without failing to count as recovered."""
    return max(10.0, 2 * checkpoint_interval_s)


class QuerySupervisor:
    """Starts one query again from its checkpoint whenever it fails (module docstring).

    ``start()`` starts the query (it resumes from its checkpoint) and returns it;
    ``lock`` is held around each start, and by the owner when it stops the queries,
    so that a restart never races a stop. ``on_start`` is told each new query;
    ``on_failure`` each failure, before the start that follows it (it mends what it can,
    such as a deleted delivery topic: :mod:`streaming.realtime.delivery_topics`).

    Each turn of its worker looks at the query once, or, while the query is failing,
    makes one restart attempt: the query's failure is attempt 1, and an attempt succeeds
    once the restarted query has run ``recovered_after_s`` without failing.
    ``stopping`` is the router's: set, no restart is started and the worker ends.
    """

    def __init__(self, name: str, query: StreamingQuery, start: Callable[[], StreamingQuery],
                 stopping: threading.Event, lock: threading.Lock, *,
                 recovered_after_s: float,
                 describe: Callable[[BaseException], str] = one_line,
                 on_start: Callable[[StreamingQuery], None] | None = None,
                 on_failure: Callable[[BaseException], object] | None = None,
                 backoff: Backoff = BACKOFF) -> None:
        self.name = name
        self.query = query
        self._start = start
        self._stopping = stopping
        self._lock = lock
        self._recovered_after_s = recovered_after_s
        self._on_start = on_start
        self._on_failure = on_failure
        self._failed: BaseException | None = None
        """The failure being restarted (the query's, then each failed attempt's)."""
        self._ended = threading.Event()
        self._done = False
        """Set when the worker ends on purpose (an end, the router stopping), not on a bug."""
        self.end: str | None = None
        """Why the query ended for good (:data:`JVM_GONE`, stopped from outside), once it did."""
        self.restarts = 0
        """Queries started again since the router started."""
        self._worker = Worker(f"{name}-supervisor", self._turn,
                              what=f"realtime mode: the {name} query", log=_log,
                              retried=RESTARTED_ERRORS, backoff=backoff,
                              first_wait_s=WATCH_INTERVAL_S, on_end=self._on_end,
                              describe=describe)

    @property
    def failure(self) -> str | None:
        """The failure being restarted, as one line (None while the query runs)."""
        return self._worker.failure

    def start(self) -> QuerySupervisor:
        self._worker.start()
        return self

    def is_alive(self) -> bool:
        """Whether the supervising thread runs (it may still restart a query)."""
        return self._worker.alive

    def stop(self, timeout: float) -> None:
        """Stop supervising (the router's ``stopping`` is set first) and wait up to
        ``timeout`` for a restart in progress."""
        self._worker.stop(timeout)

    def ended(self, timeout: float) -> str | None:
        """Wait up to ``timeout`` for the query to end for good; why it did, else None."""
        return self.end if self._ended.wait(timeout) else None

    def _turn(self) -> float | None:
        if self._stopping.is_set():
            self._quit()
            return None
        if self._failed is not None:
            return self._attempt()
        try:
            if self.query.isActive:
                return WATCH_INTERVAL_S
            failure = self.query.exception()
        except Py4JError:
            self._finish(JVM_GONE)
            return None
        if self._stopping.is_set():
            self._quit()
            return None
        if failure is None:
            self._finish(f"the {self.name} query was stopped from outside the router; "
                         "start the router again")
            return None
        self._failed = failure
        raise failure  # attempt 1, told and backed off by the worker

    def _attempt(self) -> float | None:
        """Start the query again and watch it for :attr:`_recovered_after_s`; raises the
        failure of an attempt that failed."""
        failed = self._failed
        if self._on_failure is not None and failed is not None:
            self._on_failure(failed)
        try:
            with self._lock:
                if self._stopping.is_set():
                    self._quit()
                    return None
                self.query = self._start()
                self.restarts += 1
            _log.info(f"realtime mode: the {self.name} query started again from its checkpoint")
            if self._on_start is not None:
                self._on_start(self.query)
            deadline = time.monotonic() + self._recovered_after_s
            while time.monotonic() < deadline:
                if self._stopping.wait(WATCH_INTERVAL_S):
                    self._quit()
                    return None
                if not self.query.isActive:
                    failure = self.query.exception()
                    if failure is not None:
                        raise failure
                    break  # stopped from outside: the next look says so
        except RESTARTED_ERRORS as exc:
            self._failed = exc
            raise
        except Py4JError:
            self._finish(JVM_GONE)
            return None
        except RetryAbandoned:  # no start any more (the publishes topic recreated)
            self._quit()
            return None
        except RetentionGapError as exc:  # on_retention_gap = "stop": the router stops
            self._finish(str(exc))
            return None
        self._failed = None
        return WATCH_INTERVAL_S

    def _quit(self) -> None:
        self._done = True

    def _finish(self, why: str) -> None:
        self.end = why
        self._done = True
        self._ended.set()

    def _on_end(self) -> None:
        """The worker ended: on a bug (told by the worker with its traceback) the query
        has no supervisor any more, an end of the router's."""
        if not self._done and not self._stopping.is_set():
            self._finish(f"the {self.name} query's supervisor failed (its traceback is logged)")
