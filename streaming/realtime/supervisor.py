"""Realtime mode's queries kept running: a failed query started again from its checkpoint.

Real-Time Mode does not retry a task: a lost executor or a Kafka
client that gives up (a broker away past the producer's ``delivery.timeout.ms`` with
deliveries in flight) fails the routing query as a whole. (A single broker's restart
of a minute or two is waited out by Kafka's clients: docs/reliability.md.) In micro-batch mode
the same faults fail a batch's step, which the router retries with backoff
(:mod:`streaming.retry`); here the router does the same one level up: each of
realtime mode's queries (the routing query, the audit query) has a
:class:`QuerySupervisor` thread that, when its query fails, starts it again from its
checkpoint, with :data:`streaming.retry.BACKOFF` between attempts and its reporting:
one line at the failure, then at most every 30 s while restarts keep failing, one
line at the recovery. Restarting from the checkpoint is what the mode's guarantees
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
does. Two ends are not restarts, and :meth:`QuerySupervisor.ended` says them: the
Spark JVM gone (nothing left to restart in), and a query stopped from outside the
router (someone meant it).
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
from streaming.retry import BACKOFF, Backoff, retry

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
        self._describe = describe
        self._on_start = on_start
        self._on_failure = on_failure
        self._backoff = backoff
        self._ended = threading.Event()
        self.end: str | None = None
        """Why the query ended for good (:data:`JVM_GONE`, stopped from outside), once it did."""
        self.failure: str | None = None
        """The failure being restarted, as one line (None while the query runs)."""
        self.restarts = 0
        """Queries started again since the router started."""
        self._thread = threading.Thread(target=self._run, name=f"bitroute-{name}-supervisor",
                                        daemon=True)

    def start(self) -> QuerySupervisor:
        self._thread.start()
        return self

    def is_alive(self) -> bool:
        """Whether the supervising thread runs (it may still restart a query)."""
        return self._thread.is_alive()

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def ended(self, timeout: float) -> str | None:
        """Wait up to ``timeout`` for the query to end for good; why it did, else None."""
        return self.end if self._ended.wait(timeout) else None

    def _run(self) -> None:
        try:
            while not self._stopping.wait(WATCH_INTERVAL_S):
                if self.query.isActive:
                    continue
                failure = self.query.exception()
                if self._stopping.is_set():
                    return
                if failure is None:
                    self._finish(f"the {self.name} query was stopped from outside the router; "
                                 "start the router again")
                    return
                self._restart(failure)
        except Py4JError:
            if not self._stopping.is_set():
                self._finish(JVM_GONE)
        except RetryAbandoned:
            pass  # the router is stopping
        except Exception as exc:  # noqa: BLE001 - a supervisor that dies must say so
            if not self._stopping.is_set():
                self._finish(f"the {self.name} query's supervisor failed: {one_line(exc, typed=True)}")

    def _restart(self, failure: BaseException) -> None:
        """Start the query again until a start runs :attr:`_recovered_after_s` without
        failing; ``failure`` (the query's) is reported as the first failed attempt."""
        first, last = [failure], [failure]

        def attempt() -> None:
            if first:
                raise first.pop()
            if self._on_failure is not None:
                self._on_failure(last[0])
            try:
                self._start_again()
            except RESTARTED_ERRORS as exc:
                last[0] = exc
                raise

        def describe(exc: BaseException) -> str:
            self.failure = self._describe(exc)
            return self.failure

        retry(attempt, retried=RESTARTED_ERRORS, what=f"realtime mode: the {self.name} query",
              log=_log, give_up=self._stopping.is_set, wake=self._stopping,
              backoff=self._backoff, describe=describe)
        self.failure = None

    def _start_again(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                raise RetryAbandoned("the router is stopping")
            self.query = self._start()
            self.restarts += 1
        _log.info(f"realtime mode: the {self.name} query started again from its checkpoint")
        if self._on_start is not None:
            self._on_start(self.query)
        deadline = time.monotonic() + self._recovered_after_s
        while time.monotonic() < deadline:
            if self._stopping.wait(WATCH_INTERVAL_S):
                raise RetryAbandoned("the router is stopping")
            if not self.query.isActive:
                failure = self.query.exception()
                if failure is None:
                    return  # stopped from outside: the watch loop says so
                raise failure

    def _finish(self, why: str) -> None:
        self.end = why
        self._ended.set()
