"""streaming.worker: the one policy of the background threads (start, stop, backoff, failure lines)."""

from __future__ import annotations

import logging
import threading

from streaming.retry import Backoff
from streaming.worker import Worker
from waiting import wait_until

LOG = logging.getLogger("test.worker")
FAST = Backoff(base_s=0.01, cap_s=0.02, report_interval_s=60)


def test_turns_run_in_a_named_thread_until_stopped_and_a_stop_ends_a_long_wait():
    turns = []

    def turn() -> float:
        turns.append(threading.current_thread().name)
        return 3600.0

    worker = Worker("test-turns", turn, what="the turns", log=LOG)
    worker.start()
    worker.start()  # running: nothing more
    wait_until(lambda: turns, timeout=10, what="the first turn")
    assert worker.alive and turns == ["bitroute-test-turns"]
    worker.stop(timeout=5)
    assert not worker.alive and worker.stopping.is_set()
    assert turns == ["bitroute-test-turns"]


def test_a_turn_returning_none_ends_the_worker_which_can_be_started_again():
    turns = []
    worker = Worker("test-once", lambda: turns.append(1), what="once", log=LOG)
    worker.start()
    wait_until(lambda: not worker.alive and turns, timeout=10, what="the worker's end")
    worker.start()
    wait_until(lambda: len(turns) == 2 and not worker.alive, timeout=10, what="a second run")


def test_a_failing_turn_backs_off_reports_once_and_its_recovery(caplog):
    caplog.set_level(logging.INFO, logger="test.worker")
    calls = []
    failures_seen = []

    def turn():
        calls.append(1)
        if len(calls) < 4:
            raise OSError("disk unreachable")
        failures_seen.append(worker.failure)
        return None

    worker = Worker("test-failing", turn, what="the work", log=LOG, retried=(OSError,),
                    backoff=FAST)
    worker.start()
    wait_until(lambda: not worker.alive and len(calls) == 4, timeout=10, what="the recovery")
    assert failures_seen == ["disk unreachable"]  # the one line, while failing
    assert worker.failure is None  # recovered
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["the work failed (attempt 1, for 0s): disk unreachable; retrying"]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos == ["the work succeeded at attempt 4, after 0s"]


def test_an_error_not_retried_is_a_bug_told_with_its_traceback_and_ends_the_worker(caplog):
    caplog.set_level(logging.INFO, logger="test.worker")
    calls = []

    def turn():
        calls.append(1)
        raise KeyError("a bug")

    worker = Worker("test-bug", turn, what="the work", log=LOG, retried=(OSError,), backoff=FAST)
    worker.start()
    wait_until(lambda: calls and not worker.alive, timeout=10, what="the worker's end")
    assert calls == [1]
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.getMessage() == "the work: stopped by an unexpected error"
    assert record.exc_info is not None and record.exc_info[0] is KeyError


def test_a_stop_during_the_backoff_ends_the_worker_at_once():
    calls = []

    def turn():
        calls.append(1)
        raise OSError("down")

    worker = Worker("test-backoff", turn, what="the work", log=LOG, retried=(OSError,),
                    backoff=Backoff(base_s=3600, cap_s=3600))
    worker.start()
    wait_until(lambda: calls, timeout=10, what="the first failure")
    worker.stop(timeout=5)
    assert not worker.alive and calls == [1]


def test_the_first_turn_waits_first_wait_s_and_a_stop_before_it_means_no_turn():
    calls = []
    interrupted = []
    ended = []
    worker = Worker("test-first-wait", lambda: calls.append(1), what="the work", log=LOG,
                    first_wait_s=3600, interrupt=lambda: interrupted.append(1),
                    on_end=lambda: ended.append(threading.current_thread().name))
    worker.start()
    worker.stop(timeout=5)
    assert not worker.alive and calls == [] and interrupted == [1]
    assert ended == ["bitroute-test-first-wait"]  # in the worker's own thread, at its end
