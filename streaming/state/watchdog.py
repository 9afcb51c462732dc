"""The Spark JVM ends with the router's Python process, however that process ends.

pyspark starts the JVM as a child of the Python driver. When the driver is
killed (SIGKILL, OOM killer), the JVM outlives it: its shutdown hooks wait on
a streaming query whose Python side is gone, and it keeps its memory and,
worse, the router's state folder in use. :func:`start_watchdog` starts a small
process that waits for the driver to end and then kills the JVM with SIGKILL
(the router's state is made for kills: the unfinished batch is re-run).

The watchdog also holds a copy of the router lock's descriptor
(:mod:`streaming.state.lock`) until the JVM is gone, so no second router can start
on the folder while the first one's JVM lives.

Run as ``python -m streaming.state.watchdog <driver pid> <jvm pid> <lock fd>``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from streaming.process import pid_alive

POLL_S = 0.2
JVM_EXIT_WAIT_S = 30.0


def start_watchdog(jvm_pid: int, lock_fd: int | None) -> subprocess.Popen:
    """Start the watchdog of ``jvm_pid`` for this process; it keeps ``lock_fd`` open."""
    fds = () if lock_fd is None else (lock_fd,)
    return subprocess.Popen(
        [sys.executable, "-m", "streaming.state.watchdog", str(os.getpid()), str(jvm_pid),
         str(-1 if lock_fd is None else lock_fd)],
        pass_fds=fds, stdin=subprocess.DEVNULL, start_new_session=True)


def watch(driver_pid: int, jvm_pid: int) -> None:
    """Return once the driver has ended and the JVM is gone (killed here if need be)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the router
    while pid_alive(driver_pid) and os.getppid() == driver_pid:
        time.sleep(POLL_S)
    if pid_alive(jvm_pid):
        try:
            os.kill(jvm_pid, signal.SIGKILL)
        except ProcessLookupError:
            return
    deadline = time.monotonic() + JVM_EXIT_WAIT_S
    while pid_alive(jvm_pid) and time.monotonic() < deadline:
        time.sleep(POLL_S)


if __name__ == "__main__":
    watch(int(sys.argv[1]), int(sys.argv[2]))
