"""The router under test: ``bitroute run`` (through :mod:`.faulty_router`) as a child
process in its own process group, with its stdout parsed as it comes.

:class:`Router` starts it with ``--set`` settings, waits for it to be routing,
kills it (the whole group, the Python driver alone, or the Spark JVM alone),
and stops it with SIGTERM. Its stdout and stderr go to ``log`` (appended, one
file across restarts). :meth:`Router.close` kills whatever is left; call it in
a ``finally``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from tests.reliability import faulty_router

ROOT = Path(__file__).resolve().parents[2]
READY = "Ctrl-C stops after the current batch"
BATCH = re.compile(r"^batch (\d+): (\d+) publishes, (\d+) deliveries, (\d+) rejected")
LOST = re.compile(r" (\d+) lost to retention, ")
START_TIMEOUT_S = 300.0


class RouterExited(RuntimeError):
    """The router exited while the campaign expected it to run."""


class Router:
    """One router child at a time; :meth:`start` again after a kill restarts it."""

    def __init__(self, settings: dict[str, str], folder: Path) -> None:
        self.settings = settings
        self.folder = Path(folder)
        self.faults = self.folder / "faults"
        self.log_path = self.folder / "router.log"
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.batches = 0
        self.lost = 0  # publishes the batch lines reported lost to retention
        self.fault_lines: list[str] = []
        self.errors: list[str] = []
        self._ready = threading.Event()
        self._fault = threading.Event()

    # --- life cycle -------------------------------------------------------------------
    def start(self, timeout: float = START_TIMEOUT_S) -> float:
        """Start the router and wait until its query runs; return the seconds it took."""
        if self.alive():
            raise RuntimeError("the router is running already")
        self.folder.mkdir(parents=True, exist_ok=True)
        faulty_router.disarm(self.faults)
        flags = [a for k, v in self.settings.items() for a in ("--set", f"{k}={v}")]
        log = self.log_path.open("ab")
        log.write(f"=== start {self.starts + 1} at {time.strftime('%H:%M:%S')}\n".encode())
        log.flush()
        self._ready.clear()
        self._fault.clear()
        started = time.monotonic()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.faulty_router", "--faults",
             str(self.faults), *flags],
            stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True, cwd=self.folder,
            start_new_session=True, env=env)
        self.starts += 1
        threading.Thread(target=self._read, args=(self.process, log), daemon=True).start()
        deadline = started + timeout
        while not self._ready.wait(0.5):
            if self._process().poll() is not None:
                raise RouterExited(f"the router exited with status {self._process().returncode} "
                                   f"before routing; see {self.log_path}")
            if time.monotonic() > deadline:
                self.kill()
                raise RouterExited(f"the router did not start within {timeout:.0f}s; "
                                   f"see {self.log_path}")
        return time.monotonic() - started

    def _read(self, process: subprocess.Popen, log) -> None:
        for line in process.stdout or ():  # started with stdout=PIPE
            log.write(line.encode())
            log.flush()
            line = line.rstrip("\n")
            if READY in line:
                self._ready.set()
            elif BATCH.match(line):
                self.batches += 1
                lost = LOST.search(line)
                self.lost += int(lost.group(1)) if lost else 0
            elif line.startswith("FAULT "):
                self.fault_lines.append(line)
                self._fault.set()
            elif line.startswith("bitroute: error"):
                self.errors.append(line)
        log.close()

    def _process(self) -> subprocess.Popen:
        if self.process is None:
            raise RuntimeError("the router was not started")
        return self.process

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_worker_fault(self, timeout: float) -> bool:
        """Wait until a Python worker passed the armed kill point and killed itself
        (:mod:`.worker_faults`); the router keeps running."""
        fired = self.faults / "fired"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if fired.exists():
                self.fault_lines.append(f"FAULT {fired.read_text().strip()}")
                fired.unlink()
                return True
            if not self.alive():
                return False
            time.sleep(0.2)
        return False

    def wait_fault(self, timeout: float) -> bool:
        """Wait until the armed kill point fired (and the router is gone)."""
        if not self._fault.wait(timeout):
            return False
        self._process().wait(timeout=60)
        return True

    def kill(self, target: str = "group", wait: float = 90.0) -> bool:
        """SIGKILL ``group`` (driver, JVM, workers), ``python`` (the driver alone; the
        watchdog kills the JVM) or ``jvm`` (the Spark JVM alone; the driver then exits);
        wait until the router's process is gone. Returns False when it had to be killed
        with its group after ``wait`` seconds (a driver that outlived its JVM)."""
        if not self.alive():
            return True
        if target == "group":
            os.killpg(self._process().pid, signal.SIGKILL)
        elif target == "python":
            os.kill(self._process().pid, signal.SIGKILL)
        elif target == "jvm":
            jvms = self.pids()["jvm"]
            if not jvms:
                os.killpg(self._process().pid, signal.SIGKILL)
            for pid in jvms:
                os.kill(pid, signal.SIGKILL)
        else:
            raise ValueError(f"unknown kill target {target!r}")
        try:
            self._process().wait(timeout=wait)
            return True
        except subprocess.TimeoutExpired:
            os.killpg(self._process().pid, signal.SIGKILL)
            self._process().wait(timeout=30)
            return False

    def terminate(self, timeout: float = 180.0) -> int:
        """SIGTERM: the router stops after its current batch; return its exit status."""
        if not self.alive():
            return self._process().returncode if self.process else 0
        self._process().send_signal(signal.SIGTERM)
        try:
            return self._process().wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def leftovers(self) -> int:
        """SIGKILL what is left of the last router's process group (its driver gone) and
        return how many processes that was (0 when the group ended with its driver)."""
        if self.process is None:
            return 0
        group = self._process().pid
        left = [p for p in _pids() if _pgid(p) == group]
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(left)

    def close(self) -> None:
        """Kill whatever of the router is left (its group, and a JVM that outlived it)."""
        if self.process is None:
            return
        try:
            os.killpg(self._process().pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self._process().wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        faulty_router.disarm(self.faults)

    # --- observation -----------------------------------------------------------------
    def log_lines(self, text: str) -> int:
        """Lines of the router's log (stdout and stderr, every start) containing ``text``."""
        try:
            with self.log_path.open(errors="replace") as log:
                return sum(text in line for line in log)
        except FileNotFoundError:
            return 0

    def pids(self) -> dict[str, list[int]]:
        """Role -> pids: the Python driver, the Spark JVM, the Python workers."""
        if not self.alive():
            return {"driver": [], "jvm": [], "workers": []}
        commands = {}
        for kid in psutil.Process(self._process().pid).children(recursive=True):
            try:
                commands[kid.pid] = " ".join(kid.cmdline())
            except psutil.Error:
                continue  # ended meanwhile
        jvm = [p for p, c in commands.items() if "java" in c.split(" ")[0]]
        workers = [p for p, c in commands.items()
                   if p not in jvm and "pyspark" in c and "watchdog" not in c]
        return {"driver": [self._process().pid], "jvm": jvm, "workers": workers}


def _pids() -> list[int]:
    return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]


def _pgid(pid: int) -> int | None:
    """The process group of ``pid``, None when it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[2])
