"""streaming.retry: the one backoff and reporting policy of the router and the audit committer."""

from __future__ import annotations

import logging
import threading

import pytest

from streaming.retry import BACKOFF, Backoff, RetryAbandoned, retry


def test_the_backoff_doubles_from_half_a_second_to_thirty():
    assert [BACKOFF.delay(a) for a in (1, 2, 3, 7, 8, 500)] == [0.5, 1.0, 2.0, 30.0, 30.0, 30.0]


def test_a_failing_step_is_retried_reported_once_and_its_recovery_logged(caplog):
    caplog.set_level(logging.INFO, logger="test.retry")
    calls = []

    def step():
        calls.append(1)
        if len(calls) < 3:
            raise OSError("disk unreachable")
        return "done"

    fast = Backoff(base_s=0.01, cap_s=0.02, report_interval_s=60)
    assert retry(step, retried=(OSError,), what="the step", log=logging.getLogger("test.retry"),
                 backoff=fast) == "done"
    assert len(calls) == 3
    assert caplog.text.count("the step failed (attempt 1") == 1 and "disk unreachable" in caplog.text
    assert "failed (attempt 2" not in caplog.text
    assert "the step succeeded at attempt 3" in caplog.text


def test_an_error_not_listed_propagates_at_once():
    calls = []

    def step():
        calls.append(1)
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        retry(step, retried=(OSError,), what="x", log=logging.getLogger("test.retry"))
    assert calls == [1]


def test_a_stop_request_ends_the_wait():
    stop = threading.Event()

    def step():
        stop.set()
        raise OSError("down")

    with pytest.raises(RetryAbandoned, match="the step: stopped"):
        retry(step, retried=(OSError,), what="the step", log=logging.getLogger("test.retry"),
              give_up=stop.is_set, wake=stop, backoff=Backoff(base_s=60, cap_s=60))
