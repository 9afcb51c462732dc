"""streaming.process: the one check of whether a process is alive."""

from __future__ import annotations

import os
import subprocess
import sys

from streaming.process import pid_alive
from waiting import wait_until


def test_a_running_process_is_alive_and_an_exited_child_is_not():
    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        assert pid_alive(child.pid)
    finally:
        if child.stdin is not None:  # a PIPE
            child.stdin.close()  # the child exits; unreaped, it is a zombie: not alive
    wait_until(lambda: not pid_alive(child.pid), timeout=30, what="the exited child seen as gone")


def test_a_process_that_does_not_exist_is_not_alive():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not pid_alive(child.pid)
