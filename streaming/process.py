"""The one check of whether a process is alive (the router lock's holder, the watchdog's
driver and JVM, the embedded broker)."""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host. A process that has exited but not been
    reaped (a zombie) is not alive; if it is a child of this process, it is reaped here."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it exists
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)
        if reaped:
            return False  # our child, exited: now reaped
    except ChildProcessError:
        pass  # not our child: /proc tells whether it is a zombie
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]
