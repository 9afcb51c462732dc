"""The one retry policy: a step that fails for a reason not about a record waits and tries again.

The router's batch steps (:meth:`streaming.router.service.Router.process_batch`)
and the audit's commit rounds (:mod:`streaming.audit.committer`) wait out an
unreachable cluster, disk or object store the same way (:func:`retry`):

- backoff: :data:`BACKOFF` (0.5 s doubling to 30 s between attempts);
- reporting: a warning at the first failure, then at most every
  ``report_interval_s`` (30 s) while it keeps failing, and an info line once it
  succeeds, naming the attempt and how long it failed;
- only the errors the caller lists are retried (anything else is a bug, or a
  record's problem the caller handles, and propagates at once);
- a stop request (``give_up()`` true) ends the wait with :class:`RetryAbandoned`.

:class:`Failures` is that reporting on its own, for a loop that does its own waiting:
the background workers (:mod:`streaming.worker`) report their failures with it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from streaming.errors import RetryAbandoned, one_line

T = TypeVar("T")
_WAIT_STEP_S = 0.1
"""How often a backoff wait without a wake-up event looks at ``give_up()``."""


@dataclass(frozen=True)
class Backoff:
    """Delays between attempts: ``base_s`` doubling up to ``cap_s``; failures reported at
    most every ``report_interval_s``."""

    base_s: float = 0.5
    cap_s: float = 30.0
    report_interval_s: float = 30.0

    def delay(self, attempt: int) -> float:
        """The wait after failed attempt number ``attempt`` (1-based)."""
        return min(self.cap_s, self.base_s * 2 ** min(attempt - 1, 62))


BACKOFF = Backoff()
"""bitroute's backoff (the router's batches and the audit's commits)."""


class Failures:
    """A step's failures in a row, told the one way: a warning ``<what> failed (attempt n,
    for Ns): <one line>; retrying`` at the first failure and then at most every
    ``backoff.report_interval_s``, and an info line ``<what> succeeded at attempt n, after
    Ns`` at the first success after them.

    ``what`` names the step (a callable is asked at each line); ``describe`` tells a
    failure in one line (:func:`streaming.errors.one_line`).
    """

    def __init__(self, what: Callable[[], str] | str, log: logging.Logger,
                 backoff: Backoff = BACKOFF,
                 describe: Callable[[BaseException], str] = one_line) -> None:
        self.what = what
        self.log = log
        self.backoff = backoff
        self.describe = describe
        self.attempt = 0
        """Attempts since the last success (the current one included, once :meth:`failed`)."""
        self.last: str | None = None
        """The latest failure in one line while failing, else None."""
        self._failing_since = self._last_report = 0.0

    def name(self) -> str:
        return self.what() if callable(self.what) else self.what

    def failed(self, exc: BaseException) -> float:
        """Count ``exc`` (reporting it when due); the seconds to wait before the next attempt."""
        self.attempt += 1
        now = time.monotonic()
        self._failing_since = self._failing_since or now
        self.last = self.describe(exc)
        if self.attempt == 1 or now - self._last_report >= self.backoff.report_interval_s:
            self.log.warning(f"{self.name()} failed (attempt {self.attempt}, for "
                             f"{now - self._failing_since:.0f}s): {self.last}; retrying")
            self._last_report = now
        return self.backoff.delay(self.attempt)

    def succeeded(self) -> None:
        """The step succeeded: its recovery is told when it had failed."""
        if self.attempt:
            self.log.info(f"{self.name()} succeeded at attempt {self.attempt + 1}, after "
                          f"{time.monotonic() - self._failing_since:.0f}s")
        self.attempt = 0
        self.last = None
        self._failing_since = self._last_report = 0.0


def retry(step: Callable[[], T], *, retried: tuple[type[BaseException], ...], what: Callable[[], str] | str,
          log: logging.Logger, give_up: Callable[[], bool] = lambda: False,
          wake: threading.Event | None = None, backoff: Backoff = BACKOFF,
          describe: Callable[[BaseException], str] = one_line) -> T:
    """``step()``'s result, calling it again after each failure of a ``retried`` type.

    ``what`` names the step in the log lines (``"batch 7: routing"``; a callable is
    asked at each line), reported as :class:`Failures` says. ``give_up()`` is looked at
    after each failure and during each wait (every 0.1 s, and at once when ``wake`` is
    set); when true, :class:`RetryAbandoned` is raised (from None). ``describe`` tells a
    failure in one line (:func:`streaming.errors.one_line`).
    """
    failures = Failures(what, log, backoff, describe)
    while True:
        try:
            result = step()
        except retried as exc:
            if _wait(failures.failed(exc), give_up, wake):
                raise RetryAbandoned(f"{failures.name()}: stopped while waiting to retry") from None
            continue
        failures.succeeded()
        return result


def _wait(seconds: float, give_up: Callable[[], bool], wake: threading.Event | None) -> bool:
    """Wait ``seconds``; True as soon as ``give_up()`` is."""
    end = time.monotonic() + seconds
    while not give_up():
        left = end - time.monotonic()
        if left <= 0:
            return False
        (wake.wait if wake is not None else time.sleep)(min(_WAIT_STEP_S, left))
    return True
