"""Realtime mode's routing-view thread (streaming/realtime/view.py ViewFollower) on the one
background-worker policy (streaming/worker.py): a failing step is retried with the policy's
lines and backoff, shows as the view's failure until it recovers, and the thread ends
with the router's stop. No JVM, no broker: the step is a stand-in."""

from __future__ import annotations

import logging
import threading

from streaming.realtime import view
from streaming.realtime.view import ViewFollower
from waiting import wait_until


def test_a_failing_view_step_is_retried_with_the_worker_lines_and_stops_with_the_router(
        caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="streaming")
    monkeypatch.setattr(view, "FOLLOW_INTERVAL_S", 0.01)
    failing = threading.Event()
    failing.set()
    steps: list[bool] = []

    def step() -> None:
        steps.append(failing.is_set())
        if failing.is_set():
            raise ConnectionError("the changelog is unreachable")

    stopping = threading.Event()
    follower = ViewFollower(step, stopping)
    follower.start()
    thread = next(t for t in threading.enumerate() if t.name == "bitroute-routing-view")
    wait_until(lambda: len(steps) >= 3, "retried steps", 10)
    assert follower.failure == "the changelog is unreachable"
    failing.clear()
    wait_until(lambda: follower.failure is None and not steps[-1], "the recovery", 10)
    lines = [m for m in caplog.messages if m.startswith("updating the routing view")]
    assert lines[0] == ("updating the routing view failed (attempt 1, for 0s): "
                        "the changelog is unreachable; retrying")
    assert sum("failed (attempt" in m for m in lines) == 1, "one line per 30 s, not per attempt"
    assert lines[-1].startswith("updating the routing view succeeded at attempt ")

    follower.stop(5)
    assert stopping.is_set() and not thread.is_alive()
    done = len(steps)
    thread.join()  # ended: no step can follow the stop
    assert len(steps) == done
