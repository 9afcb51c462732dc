"""Per-role memory and CPU of running processes, sampled from /proc.

A role is a name and a function returning its current pids (a broker's process
group, the Spark driver JVM, the Python workers, ...). The sampler records each
role's peak resident set (summed over its processes) and the CPU time it used
while sampling, so a report can say which process saturates a core.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0


def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0.0


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def children(pid: int) -> list[int]:
    """Every descendant of ``pid``."""
    parents: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                parents.setdefault(ppid, []).append(int(entry.name))
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
    out, todo = [], [pid]
    while todo:
        for c in parents.get(todo.pop(), ()):
            out.append(c)
            todo.append(c)
    return out


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
            except Exception:  # a role whose process is gone has no pids
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

    def start(self) -> "Sampler":
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
