"""Per-role memory and CPU of running processes (psutil).

A role is a name and a function returning its current pids (a broker's process
group, the Spark driver JVM, the Python workers, ...). The sampler records each
role's peak resident set (summed over its processes) and the CPU time it used
while sampling, so a report can say which process saturates a core.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil


def rss_bytes(pid: int) -> int:
    """The resident set of ``pid``; 0 once it is gone."""
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return 0


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of ``pid``; 0 once it is gone."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


def cmdline(pid: int) -> str:
    """``pid``'s command line, space-separated; empty once it is gone."""
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def children(pid: int) -> list[int]:
    """Every descendant of ``pid``."""
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


@dataclass
class RoleStats:
    peak_rss: int = 0
    cpu_s: float = 0.0
    max_core: float = 0.0  # the busiest single process, in cores
    _last: dict[int, float] = field(default_factory=dict)


class Sampler:
    """Sample roles every ``interval`` seconds in a thread between start() and stop()."""

    def __init__(self, roles: dict[str, Callable[[], list[int]]], interval: float = 0.5):
        self.roles = roles
        self.interval = interval
        self.stats = {name: RoleStats() for name in roles}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.started = self.stopped = 0.0

    def _sample(self, dt: float | None) -> None:
        for name, pids_of in self.roles.items():
            st = self.stats[name]
            try:
                pids = pids_of()
            except Exception:  # noqa: BLE001 - a role whose process is gone has no pids
                pids = []
            st.peak_rss = max(st.peak_rss, sum(rss_bytes(p) for p in pids))
            for p in pids:
                c = cpu_seconds(p)
                if p in st._last:
                    d = max(0.0, c - st._last[p])
                    st.cpu_s += d
                    if dt:
                        st.max_core = max(st.max_core, d / dt)
                st._last[p] = c

    def _run(self) -> None:
        last = time.monotonic()
        self._sample(None)
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            self._sample(now - last)
            last = now

    def start(self) -> Sampler:
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, RoleStats]:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        self.stopped = time.monotonic()
        return self.stats

    def cores(self, name: str) -> float:
        """Average cores the role used while sampling."""
        span = max(1e-9, (self.stopped or time.monotonic()) - self.started)
        return self.stats[name].cpu_s / span
