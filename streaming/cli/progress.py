"""What ``bitroute run`` prints while it routes: one line per batch on stdout (with
``--json``, one JSON object per batch instead), and the progress of a long changelog
catch-up on stderr.

These are listeners the command line hands to the library's
:class:`~streaming.router.service.Router`: :class:`BatchLines` is one of its
``report_listeners`` (called with each batch's
:class:`~streaming.router.batch.report.BatchReport`), :class:`CatchUpProgress` its
``catch_up_progress`` (one made per catch-up, called as ``progress(done, total)``
by :meth:`streaming.router.subscriptions.changelog.ChangelogReader.read_to_end`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from streaming.cli.render import batch_line

if TYPE_CHECKING:
    from streaming.router.batch.report import BatchReport

PROGRESS_AFTER_S = 2.0
"""A catch-up prints progress once it has run this long, then at most this often."""


class BatchLines:
    """A report listener: each batch's line (:func:`streaming.cli.render.batch_line`) on
    ``stream`` (stdout), flushed at once."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream

    def __call__(self, report: BatchReport) -> None:
        print(batch_line(report), file=self._stream or sys.stdout, flush=True)


DEPRECATED_KEYS = {"replayed": "rerun"}
"""``bitroute run --json``'s former key -> its key now: the former is still written, with
the same value, so that programs written against it keep working (docs/operations.md,
"Deprecated names"); to be removed in a later release."""


class BatchJson:
    """A report listener for ``bitroute run --json``: each batch as one JSON object on one
    line of ``stream`` (stdout), flushed at once.

    The object is the :class:`~streaming.router.batch.report.BatchReport`'s fields by name
    (``batch_id``, ``rows``, ``deliveries``, ``rejected``, ``snapshot_version``,
    ``seconds``, ``rerun``, ``stages``, ``attempts``, ``routed_in``, ``lost``, ``expired``),
    ``finished_at``, the wall clock (Unix seconds) when the listener was called, and the
    former names of :data:`DEPRECATED_KEYS` (``replayed``: ``rerun``'s).
    """

    def __init__(self, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._stream = stream
        self._clock = clock

    def __call__(self, report: BatchReport) -> None:
        record = dataclasses.asdict(report)
        record["finished_at"] = self._clock()
        for old, new in DEPRECATED_KEYS.items():
            record[old] = record[new]
        print(json.dumps(record), file=self._stream or sys.stdout, flush=True)


class CatchUpProgress:
    """The progress callback of one changelog catch-up: lines on ``stream`` (stderr).

    Time counts from construction: make one right before the catch-up. A
    catch-up that ends within :data:`PROGRESS_AFTER_S` prints nothing; a longer
    one prints a line at most every :data:`PROGRESS_AFTER_S` and, at
    ``done == total``, a final line with the total.
    """

    def __init__(self, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._stream = stream
        self._clock = clock
        self._started = clock()
        self._printed: float | None = None

    def __call__(self, done: int, total: int) -> None:
        now = self._clock()
        elapsed = now - self._started
        if done >= total:
            if self._printed is not None or (elapsed >= PROGRESS_AFTER_S and total > 0):
                self._print(finished_line(total, elapsed))
                self._printed = now
        elif elapsed >= PROGRESS_AFTER_S and (self._printed is None
                                               or now - self._printed >= PROGRESS_AFTER_S):
            self._print(progress_line(done, total, elapsed))
            self._printed = now

    def _print(self, line: str) -> None:
        print(f"bitroute: {line}", file=self._stream or sys.stderr, flush=True)


def progress_line(done: int, total: int, elapsed: float) -> str:
    """``catching up the changelog: 412,000 of 1,000,000 records (98,000/s, about 6s left)``."""
    rate = done / elapsed if elapsed > 0 else 0.0
    left = f", about {_duration((total - done) / rate)} left" if rate > 0 else ""
    return f"catching up the changelog: {done:,} of {total:,} records ({rate:,.0f}/s{left})"


def finished_line(total: int, elapsed: float) -> str:
    """``caught up the changelog: 1,000,000 records in 10.2s (98,000/s)``."""
    rate = total / elapsed if elapsed > 0 else 0.0
    return f"caught up the changelog: {total:,} records in {elapsed:.1f}s ({rate:,.0f}/s)"


def _duration(seconds: float) -> str:
    """Whole seconds as ``6s``, ``2m05s`` or ``1h02m``, rounded up (0 -> ``1s``)."""
    whole = max(math.ceil(seconds), 1)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
