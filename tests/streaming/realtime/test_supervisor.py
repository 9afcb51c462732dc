"""The realtime queries' supervisor (streaming/realtime/supervisor.py) on fake queries:
a failed query is started again with the retry policy's lines, a recovery is a restart
that keeps running, and the ends that are no failure (the JVM gone, a stop from
outside) end the supervision with their line. No JVM: the queries are stand-ins."""

from __future__ import annotations

import logging
import threading

import pytest
from py4j.protocol import Py4JNetworkError
from pyspark.errors import StreamingQueryException

from streaming.realtime import supervisor as supervision
from streaming.realtime.supervisor import JVM_GONE, QuerySupervisor
from streaming.retry import Backoff
from waiting import wait_until

FAST = Backoff(base_s=0.01, cap_s=0.05, report_interval_s=30.0)


class FakeQuery:
    """A streaming query that runs until told to fail or stop."""

    def __init__(self, fails_with: BaseException | None = None) -> None:
        self.failure: BaseException | None = None
        self.active = True
        if fails_with is not None:
            self.fail(fails_with)

    @property
    def isActive(self) -> bool:
        return self.active

    def exception(self):
        return self.failure

    def fail(self, failure: BaseException) -> None:
        self.failure, self.active = failure, False

    def stop(self) -> None:
        self.active = False


class JvmGone(FakeQuery):
    @property
    def isActive(self) -> bool:
        raise Py4JNetworkError("Answer from Java side is empty")


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervision, "WATCH_INTERVAL_S", 0.02)


def _supervise(first, starts, stopping=None, recovered_after_s=0.2) -> QuerySupervisor:
    started = iter(starts)
    return QuerySupervisor("routing", first, lambda: next(started), stopping or threading.Event(),
                           threading.Lock(), recovered_after_s=recovered_after_s,
                           backoff=FAST).start()


def test_a_failed_query_is_started_again_until_a_start_keeps_running(caplog):
    caplog.set_level(logging.INFO, logger="streaming")
    broker_down = StreamingQueryException(message="Timeout expired while fetching topic metadata")
    first = FakeQuery()
    # The first restart meets the broker still down (it fails at once), the second runs.
    again, running = FakeQuery(fails_with=broker_down), FakeQuery()
    stopping = threading.Event()
    supervisor = _supervise(first, [again, running], stopping)
    first.fail(broker_down)
    wait_until(lambda: supervisor.query is running and supervisor.failure is None
               and any("succeeded at attempt" in m for m in caplog.messages),
               "the recovery", 10)
    lines = [m for m in caplog.messages if "the routing query" in m]
    assert lines[0].startswith("realtime mode: the routing query failed (attempt 1, for 0s): "
                               "Timeout expired while fetching topic metadata")
    assert lines[-1].startswith("realtime mode: the routing query succeeded at attempt 3")
    assert sum("failed (attempt" in m for m in lines) == 1, "one line per 30 s, not per attempt"
    assert supervisor.restarts == 2 and supervisor.ended(0) is None
    stopping.set()
    supervisor.stop(5)


def test_a_restart_that_fails_is_told_in_status_until_it_recovers():
    first = FakeQuery()
    supervisor = _supervise(first, [FakeQuery()], recovered_after_s=5)
    first.fail(StreamingQueryException(message="Kafka is down"))
    wait_until(lambda: supervisor.failure == "Kafka is down", "the failure in status", 5)


def test_the_jvm_gone_and_a_stop_from_outside_end_the_supervision_with_their_line():
    assert _supervise(JvmGone(), []).ended(5) == JVM_GONE
    stopped = FakeQuery()
    supervisor = _supervise(stopped, [])
    stopped.stop()
    assert "stopped from outside the router" in (supervisor.ended(5) or "")


def test_a_stopping_router_ends_the_restarts_and_starts_no_query():
    stopping = threading.Event()
    first = FakeQuery()
    failing = [FakeQuery(fails_with=StreamingQueryException(message="down")) for _ in range(1000)]
    supervisor = _supervise(first, failing, stopping)
    first.fail(StreamingQueryException(message="down"))
    wait_until(lambda: supervisor.restarts >= 2, "restarts", 5)
    stopping.set()
    supervisor.stop(5)
    restarts = supervisor.restarts
    # Joined: its thread is gone, so no restart can follow.
    assert not supervisor.is_alive()
    assert supervisor.restarts == restarts and supervisor.ended(0) is None


def test_each_failure_is_told_to_on_failure_before_the_start_that_follows_it():
    deleted = StreamingQueryException(message="Topic bitroute.deliveries.cat not present in "
                                              "metadata after 60000 ms.")
    still = StreamingQueryException(message="still missing")
    first, again, running = FakeQuery(), FakeQuery(fails_with=still), FakeQuery()
    told: list[tuple[str, int]] = []
    started = iter([again, running])
    supervisor = QuerySupervisor(  # FakeQuery: a stand-in for pyspark's StreamingQuery
        "routing", first, lambda: next(started), threading.Event(), threading.Lock(),  # type: ignore[arg-type, return-value]
        recovered_after_s=0.2, backoff=FAST,
        on_failure=lambda failure: told.append((str(failure), supervisor.restarts))).start()
    first.fail(deleted)
    wait_until(lambda: supervisor.query is running and supervisor.failure is None, "the recovery", 10)
    assert told == [(str(deleted), 0), (str(still), 1)]


def test_a_retention_gap_met_by_a_restart_under_stop_ends_the_supervision_with_its_line():
    """streaming.on_retention_gap = "stop": the routing query's start raises the gap's line
    (streaming.realtime.retention), which is the router's end, not a failure to restart."""
    from streaming.router.errors import RetentionGapError

    gap = RetentionGapError("realtime mode: Kafka deleted publishes the routing query had "
                            "not read (p partition 0 offsets 3..22). The router stopped")

    def start():
        raise gap

    first = FakeQuery()
    supervisor = QuerySupervisor("routing", first, start, threading.Event(),  # type: ignore[arg-type]
                                 threading.Lock(), recovered_after_s=0.2, backoff=FAST).start()
    first.fail(StreamingQueryException(message="Kafka is down"))
    assert supervisor.ended(10) == str(gap)
    assert supervisor.restarts == 0
    wait_until(lambda: not supervisor.is_alive(), "the supervisor's end", 5)
