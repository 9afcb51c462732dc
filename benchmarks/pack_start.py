"""What the executors' packed environment costs (issue 27): size, build, first task.

    python -m benchmarks pack-start [--repeat 1]

- build: ``streaming.pack.archive`` into an empty folder (cold), then again
  (cached: the digest of what would go in, no archive written);
- first task: a Spark standalone master and one one-core worker on loopback
  (pyspark's own ``spark-class``), a new application, one job of one task whose
  ``mapInArrow`` function imports what a routing task imports (bitroute's
  routing modules, the kernel, pyarrow, pandas); the clock starts once the
  worker has registered with the master: the time from the session's start to
  that job's result, then a second job (the Python worker warm), and from the
  executor's log the archive's fetch and unpack and the Python worker's boot
  and init (Spark's ``Times:`` line). Two ways, in the same run:

  * archive: the worker's environment has no bitroute Python (no virtualenv on
    PATH, no PYTHONPATH); the executor fetches and unpacks the archive
    (``spark.archives``) and its Python workers run from it;
  * baseline: the worker runs the driver's own interpreter
    (``spark.pyspark.python`` = this Python), as if bitroute were installed at
    the same path on the worker: nothing to fetch or unpack.

The machine is shared: figures are noisy, the load average is printed with them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import pyspark

from streaming import pack
from streaming.config import load
from streaming.kafka.broker import free_port


def _imports(batches):
    for module in ("pandas", "bitroute_kernel", "streaming.router.batch.routing", "streaming.router.batch.delivery"):
        importlib.import_module(module)
    yield from batches


def _bare_environment() -> dict[str, str]:
    venv_bin = Path(sys.executable).parent
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep)
            if p and Path(p) != venv_bin and not (Path(p) / "bitroute").exists()]
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYSPARK_PYTHON", "VIRTUAL_ENV")}
    return dict(env, PATH=os.pathsep.join(path))


@contextmanager
def _cluster(root: Path, env: dict[str, str]):
    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    env = dict(env, SPARK_HOME=str(Path(pyspark.__file__).parent), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_LOG_DIR=str(root / "logs"))
    port, ui = free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    with (root / "cluster.log").open("a") as logs:
        processes = [subprocess.Popen(
            [str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(port), "--webui-port", str(ui)],
            env=env, stdout=logs, stderr=subprocess.STDOUT, start_new_session=True)]
        processes.append(subprocess.Popen(
            [str(spark_class), "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
             "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()),
             "--work-dir", str(root / "work")],
            env=env, stdout=logs, stderr=subprocess.STDOUT, start_new_session=True))
        try:
            _wait_for_worker(ui)
            yield url
        finally:
            for process in processes:
                os.killpg(process.pid, signal.SIGTERM)
            for process in processes:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)


def _wait_for_worker(ui: int, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as reply:
                if json.load(reply).get("aliveworkers", 0) >= 1:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("the worker did not register with the master")


_STAMP = re.compile(r"^(\d\d/\d\d/\d\d \d\d:\d\d:\d\d) ")


def _executor_phases(root: Path) -> str:
    """The archive's fetch + unpack (to the next log line) and the Python worker's
    boot and init, from the executor's stderr."""
    stderr = next((root / "work").glob("app-*/*/stderr"), None)
    if stderr is None:
        return "no executor log"
    lines = stderr.read_text().splitlines()

    def when(line: str) -> datetime:
        stamp = _STAMP.match(line)
        if stamp is None:
            raise ValueError(f"no time stamp: {line!r}")
        return datetime.strptime(stamp.group(1), "%y/%m/%d %H:%M:%S")

    parts = []
    fetch = next((i for i, line in enumerate(lines) if "Fetching spark://" in line and ".tar.gz#" in line), None)
    unpack = next((i for i, line in enumerate(lines) if "Unpacking an archive" in line), None)
    if fetch is not None and unpack is not None and unpack + 1 < len(lines):
        after = next(line for line in lines[unpack + 1:] if _STAMP.match(line))
        parts.append(f"fetch {(when(lines[unpack]) - when(lines[fetch])).seconds} s, "
                     f"unpack {(when(after) - when(lines[unpack])).seconds} s (1 s resolution)")
    times = next((line for line in lines if "Times: total" in line), "")
    found = re.search(r"boot = (\d+), init = (\d+)", times)
    if found:
        parts.append(f"Python worker boot {int(found.group(1)) / 1000:.1f} s, "
                     f"init {int(found.group(2)) / 1000:.1f} s")
    return "; ".join(parts)


def _first_task(root: Path, baseline: bool) -> tuple[float, float]:
    from streaming.session import spark_session

    env = dict(os.environ) if baseline else _bare_environment()
    with _cluster(root, env) as master:
        overrides = {"spark.master": master, "streaming.checkpoint_dir": str(root / "state"),
                     "spark.log_level": "ERROR", "spark.options.spark.executor.memory": "512m"}
        if baseline:
            overrides["spark.options.spark.pyspark.python"] = sys.executable
        config = load(overrides=overrides, environ={})
        if not baseline:
            pack.archive()  # built (or found) before the clock starts: not a task's cost
        started = time.monotonic()
        session = spark_session(config)
        try:
            frame = session.range(2, numPartitions=1)
            schema = frame.schema
            frame.mapInArrow(_imports, schema).collect()
            first = time.monotonic() - started
            again = time.monotonic()
            frame.mapInArrow(_imports, schema).collect()
            second = time.monotonic() - again
        finally:
            session.stop()
    return first, second


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--smoke", action="store_true",
                        help="the builds only (no cluster): what CI runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.repeat = 0
    os.environ.pop("PYSPARK_PYTHON", None)
    with tempfile.TemporaryDirectory(prefix="pack-bench-") as tmp:
        root = Path(tmp)
        started = time.monotonic()
        cpu = time.process_time()
        packed = pack.archive(root / "cold")
        print(f"build (cold): {time.monotonic() - started:.1f} s wall, "
              f"{time.process_time() - cpu:.1f} s CPU, {packed.size_bytes / 1e6:.0f} MB, "
              f"bitroute and {packed.distributions} distributions")
        started = time.monotonic()
        pack.archive(root / "cold")
        print(f"build (cached): {time.monotonic() - started:.2f} s")
        for n in range(args.repeat):
            for baseline in (True, False):
                name = "baseline (driver's Python on the worker)" if baseline else "archive"
                folder = root / f"{'baseline' if baseline else 'archive'}-{n}"
                folder.mkdir()
                first, second = _first_task(folder, baseline)
                print(f"first task, {name}: {first:.1f} s from session start "
                      f"({_executor_phases(folder)}); second job {second:.1f} s; "
                      f"load average {os.getloadavg()[0]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
