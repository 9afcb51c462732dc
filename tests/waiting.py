"""Waiting on a condition with a deadline: the one way tests wait for something to happen."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
POLL_S = 0.05


def wait_until(condition: Callable[[], T | None], what: str = "the condition",
               timeout: float = 60.0, poll: float = POLL_S) -> T:
    """Poll ``condition`` every ``poll`` seconds until it returns a true value and return
    that value; fail the test with ``what`` once ``timeout`` seconds have passed. A
    ``poll`` longer than the default is for a condition costly to evaluate."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        time.sleep(poll)  # the polling interval, not a wait for the event itself
