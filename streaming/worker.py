"""The one background-worker policy: how each of the router's background threads starts,
stops, backs off and reports.

The audit committer (:mod:`streaming.audit.committer`), the audit maintenance
(:mod:`streaming.audit.maintenance`), the lease renewer (:mod:`streaming.state.lease`),
the replays (:mod:`streaming.router.replay.replay`), the broker watch's prober
(:mod:`streaming.kafka.broker_watch`) and realtime mode's publishes-topic watch
(:mod:`streaming.realtime.incarnation`), routing-view follower
(:mod:`streaming.realtime.view`) and query supervisors
(:mod:`streaming.realtime.supervisor`) are each a :class:`Worker`:

- start: :meth:`Worker.start` runs ``turn()`` in a daemon thread named
  ``bitroute-<name>``, after ``first_wait_s``; a second start while it runs does
  nothing (one that ended can be started again);
- the loop: ``turn()`` returns the seconds to wait before the next turn, or None when
  the worker's work is done (the thread ends); the wait ends early at a stop;
- failures: a ``turn()`` that raises one of ``retried`` is tried again after
  ``backoff``'s delay (:data:`streaming.retry.BACKOFF` unless the worker has its own
  cadence), reported by :class:`streaming.retry.Failures` (a warning through
  :func:`streaming.errors.one_line` at the first failure and then at most every 30 s,
  an info line at the recovery). Anything else is a bug: it is logged with its
  traceback and the worker ends;
- stop: :meth:`Worker.stop` sets :attr:`Worker.stopping` (the worker's own event,
  which ``turn()`` may wait on or look at), calls ``interrupt`` (to wake a wait of the
  owner's, on a condition) and joins the thread for at most ``timeout`` seconds. The
  worker's owner stops it in its own ``stop()`` (after whatever must finish first, a
  flush), and :meth:`streaming.router.service.Router.stop` stops every owner;
- end: however the thread ends, ``on_end()`` runs last in it (what the worker holds,
  released by the thread that used it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from streaming.errors import one_line
from streaming.retry import BACKOFF, Backoff, Failures

_log = logging.getLogger(__name__)


class Worker:
    """One background thread running ``turn()`` until stopped (module docstring).

    ``what`` names the work in the failure lines (``"renewing the router lease"``);
    ``describe`` tells a failure in one line.
    """

    def __init__(self, name: str, turn: Callable[[], float | None], *,
                 what: Callable[[], str] | str, log: logging.Logger = _log,
                 retried: tuple[type[BaseException], ...] = (Exception,),
                 backoff: Backoff = BACKOFF, first_wait_s: float = 0.0,
                 interrupt: Callable[[], None] | None = None,
                 on_end: Callable[[], None] | None = None,
                 describe: Callable[[BaseException], str] = one_line) -> None:
        self.name = f"bitroute-{name}"
        self._turn = turn
        self.retried = retried
        self.first_wait_s = first_wait_s
        self.stopping = threading.Event()
        """Set by :meth:`stop` (cleared by :meth:`start`)."""
        self._interrupt = interrupt
        self._on_end = on_end
        self.failures = Failures(what, log, backoff, describe)
        self._log = log
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    @property
    def alive(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def failure(self) -> str | None:
        """The latest failure in one line while the worker is failing, else None."""
        return self.failures.last

    def start(self) -> None:
        """Start the thread (nothing when it runs already); clears a previous stop."""
        with self._start_lock:
            if self.alive:
                return
            self.stopping.clear()
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = 5.0) -> None:
        """Ask the worker to stop and wait at most ``timeout`` seconds for its thread
        (a turn in progress finishes; it is not interrupted)."""
        self.stopping.set()
        if self._interrupt is not None:
            self._interrupt()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            if self._on_end is not None:
                self._on_end()

    def _loop(self) -> None:
        wait: float | None = self.first_wait_s
        while wait is not None and not self.stopping.wait(wait):
            try:
                wait = self._turn()
            except self.retried as exc:
                wait = self.failures.failed(exc)
                continue
            except BaseException:  # noqa: BLE001 - a bug: told once, the worker ends
                self._log.exception(f"{self.failures.name()}: stopped by an unexpected error")
                return
            self.failures.succeeded()
