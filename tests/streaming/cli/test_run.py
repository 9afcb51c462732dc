"""`bitroute run` as a process: as users start it (routes, prints progress, stops on
SIGTERM), killed with SIGKILL and restarted, and on a Spark cluster.

The tests run the real command in a child process (its own SparkSession and
JVM) against the session's broker, and check the outcome from outside: its
output, the delivery topics and the Delta audit tables.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pyspark
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from deltalake import DeltaTable

from delivery_order import assert_publish_order_kept, delivery_order
from isolation import isolated_settings
from kafka_io import message_id_of
from router_process import DEADLINE_S, RouterProcess, publish_keys
from s3_server import S3Server
from short_jvm import short_jvm_env
from streaming.config import Config, load
from streaming.kafka import client_verbs as client
from streaming.kafka.broker import free_port
from waiting import wait_until


def _delivered(config: Config, subscriber: str, expected: set[str],
               timeout: float = DEADLINE_S) -> Counter[str]:
    """Read the subscriber's topic from the start until every expected message id arrived."""
    topic = config.kafka.layout.topic(subscriber)
    consumer = Consumer({"bootstrap.servers": config.kafka.bootstrap, "group.id": uuid.uuid4().hex,
                         "enable.auto.commit": False})
    partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    seen: Counter[str] = Counter()

    def all_arrived() -> bool:
        for record in consumer.consume(500, timeout=1.0):
            if record.error() is None:
                seen[message_id_of(record)] += 1
        return expected <= set(seen)

    try:
        wait_until(all_arrived, f"every publish reaching {subscriber} "
                   f"({len(expected - set(seen))} missing)", timeout)
    finally:
        consumer.close()
    return seen


def _audit_counts(config: Config, table: str, columns: list[str]) -> Counter:
    rows = DeltaTable(config.delta.table_path(table)).to_pyarrow_table(columns=columns)
    return Counter(zip(*(rows.column(c).to_pylist() for c in columns), strict=True))


def test_bitroute_run_routes_prints_progress_and_stops_cleanly_on_sigterm(
        base_config: Config, tmp_path: Path):
    settings = isolated_settings(base_config, tmp_path)
    router = RouterProcess(settings, tmp_path / "router.log", cwd=tmp_path)
    try:
        router.wait_for(re.compile(r"Ctrl-C stops after the current batch"))
        producer = Producer({"bootstrap.servers": base_config.kafka.bootstrap})
        producer.produce(settings["kafka.subscriptions_topic"], key=b"s1", value=json.dumps(
            {"exchange": "mqtt", "subscriber": "kim", "filter": "door/+"}).encode())
        producer.produce(settings["kafka.publishes_topic"], key=b"door/front", value=b"open",
                         headers=[("exchange", b"mqtt")])
        assert producer.flush(30) == 0
        progress = router.wait_for(re.compile(r"^batch .*")).group(0)
        assert "1 publishes, 1 deliveries, 0 rejected, snapshot v" in progress
    finally:
        status = router.terminate(signal.SIGTERM)
    assert status == 0, (tmp_path / "router.log").read_text()[-3000:]
    assert "bitroute: stopped" in router.seen
    # stdout is the router's own lines only: Spark's and Kafka's logs go to stderr.
    assert all(line.startswith(("bitroute: ", "batch ")) for line in router.seen), router.seen
    # The batch outlasted the 100 ms trigger (the first one loads the matcher), for which
    # Spark logs "Current batch is falling behind": silenced (conf/spark-log4j2.properties).
    took = re.search(r", ([0-9.]+)s \(", progress)
    assert took is not None and float(took.group(1)) > 0.1, progress
    assert "falling behind" not in (tmp_path / "router.log").read_text()


def _children(pid: int) -> set[int]:
    """Every descendant of ``pid`` now (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for child, its_parent in parents.items():
            if its_parent == parent and child not in found:
                found.add(child)
                todo.append(child)
    return found


def _ended_within(pids: set[int], timeout: float) -> bool:
    """Wait (on each process's pidfd, no polling) until every one of ``pids`` has ended."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return False
        finally:
            os.close(fd)
    return True


def test_one_router_per_state_folder_and_its_jvm_ends_with_it(base_config: Config, tmp_path: Path):
    """A second router on the same folders is refused, naming the first; the first one's
    Spark JVM dies with its Python process killed alone (SIGKILL), and then the folder
    is free for a new router."""
    settings = isolated_settings(base_config, tmp_path)
    first = RouterProcess(settings, tmp_path / "router.log")
    try:
        first.wait_for(re.compile(r"Ctrl-C stops after the current batch"))
        second = subprocess.run([sys.executable, "-m", "streaming.cli.main", "run",
                                 *[a for k, v in settings.items() for a in ("--set", f"{k}={v}")]],
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 1
        assert f"another router holds {tmp_path / 'checkpoints'} (pid {first.process.pid}" in second.stderr
        jvms = {p for p in _children(first.process.pid)
                if "java" in (Path("/proc") / str(p) / "cmdline").read_bytes().split(b"\0")[0].decode()}
        assert jvms, "the router's Spark JVM was not found among its children"
        os.kill(first.process.pid, signal.SIGKILL)  # the Python process alone
        first.process.wait(timeout=60)
        assert _ended_within(jvms, 30), "the Spark JVM outlived its killed router"
    finally:
        first.kill() if first.process.poll() is None else None
    third = RouterProcess(settings, tmp_path / "router.log")
    try:
        third.wait_for(re.compile(r"Ctrl-C stops after the current batch"))
    finally:
        assert third.terminate() == 0


def test_a_router_killed_mid_stream_and_restarted_loses_nothing_and_audits_once(
        base_config: Config, tmp_path: Path):
    settings = isolated_settings(base_config, tmp_path, **{"streaming.max_offsets_per_trigger": "20"})
    config = load(overrides=settings, environ={})
    client.subscribe(config, "amq.topic", "alpha", "orders.#", sub_id="a1")
    client.subscribe(config, "amq.topic", "beta", "orders.*.paid", sub_id="b1")
    keys = [("amq.topic", f"orders.{i % 7}.paid") for i in range(120)]

    first = RouterProcess(settings, tmp_path / "router.log")
    try:
        first.wait_for(re.compile(r"snapshot v\d+ with 2 subscriptions"))
        ids = publish_keys(config, keys)
        # Kill in the middle of the stream: a batch of 20 is done, most are not.
        first.wait_for(re.compile(r"^batch [1-9]\d*: "))
    finally:
        first.kill()

    second = RouterProcess(settings, tmp_path / "router.log")
    try:
        second.wait_for(re.compile(r"Ctrl-C stops after the current batch"))
        alpha = _delivered(config, "alpha", set(ids))
        beta = _delivered(config, "beta", set(ids))
    finally:
        status = second.terminate(signal.SIGINT)
    assert status == 0
    assert "bitroute: SIGINT: stopping after the current batch (again to stop now)" in second.seen
    assert "bitroute: stopped" in second.seen
    assert set(alpha) == set(beta) == set(ids)  # at least once, nothing lost
    assert len({m.rsplit("/", 2)[1] for m in ids}) == 2  # the keys spread over both partitions
    for subscriber in ("alpha", "beta"):
        assert_publish_order_kept(delivery_order(config, subscriber))

    deliveries = _audit_counts(config, "deliveries", ["message_id", "subscriber"])
    assert set(deliveries) == {(m, s) for m in ids for s in ("alpha", "beta")}
    assert set(deliveries.values()) == {1}, "a (message, subscriber) was audited twice"
    messages = _audit_counts(config, "messages", ["message_id", "outcome"])
    assert messages == Counter({(m, "routed"): 1 for m in ids})


@contextmanager
def standalone_cluster(root: Path, workers: int = 2, environ: dict[str, str] | None = None
                       ) -> Iterator[tuple[str, list[Path]]]:
    """A Spark standalone master and ``workers`` one-core workers on loopback.

    Started from the pyspark distribution's own ``spark-class``, in
    :func:`_bare_environment`: the workers' Python has none of bitroute's
    packages, so executors route only with what the application ships them.
    Yields the master URL and the workers' work folders (one sub-folder per
    executor launched there). Everything is stopped on exit.
    """
    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    # environ: what else the hosts have, such as an object store's credentials.
    # The master's, the workers' and (inheriting the workers') the executors' JVMs live
    # the module's tests: short_jvm's options, as the routers'.
    env = short_jvm_env(dict(_bare_environment(), SPARK_LOCAL_IP="127.0.0.1",
                             SPARK_LOG_DIR=str(root / "logs"), **(environ or {})))
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    logs = (root / "cluster.log").open("a")
    processes = [subprocess.Popen(
        [str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
         "--port", str(port), "--webui-port", str(free_port())],
        env=env, stdout=logs, stderr=subprocess.STDOUT, start_new_session=True)]
    work_dirs = [root / f"worker-{i}" for i in range(workers)]
    for work_dir in work_dirs:
        processes.append(subprocess.Popen(
            [str(spark_class), "org.apache.spark.deploy.worker.Worker", url, "--host",
             "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()),
             "--work-dir", str(work_dir)],
            env=env, stdout=logs, stderr=subprocess.STDOUT, start_new_session=True))
    try:
        yield url, work_dirs
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        logs.close()


_PYTHON_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON",
                     "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")


def _bare_environment() -> dict[str, str]:
    """A worker host's environment: this one without bitroute's Python.

    No virtualenv on PATH, none of the Python variables (PYTHONPATH would hand
    the workers this checkout), SPARK_HOME the pyspark distribution: the Spark
    a worker runs and, for Python, only what ``bitroute pack`` says it needs.
    """
    venv_bin = Path(sys.executable).parent
    path = [p for p in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
            if p and Path(p) != venv_bin and not (Path(p) / "bitroute").exists()]
    env = {k: v for k, v in os.environ.items() if k not in _PYTHON_VARIABLES}
    return dict(env, PATH=os.pathsep.join(path), SPARK_HOME=str(Path(pyspark.__file__).parent))


def _driver_environment() -> dict[str, str]:
    """The router host's: bitroute's environment activated (its bin first on PATH),
    PYSPARK_PYTHON unset, as docs/running.md has it; its driver's JVM with short_jvm's
    options."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return short_jvm_env(env)


def _assert_workers_python_is_bare(tmp_path: Path) -> None:
    """The interpreter the packed environment runs on a worker imports none of
    bitroute's packages by itself."""
    from streaming import pack

    for module in ("streaming", "bitroute_kernel", "numpy", "pyarrow"):
        bare = subprocess.run([pack.base_interpreter(), "-c", f"import {module}"],
                              env=_bare_environment(), cwd=tmp_path, capture_output=True)
        assert bare.returncode != 0, f"the workers' Python imports {module} by itself"


def _applications(work_dirs: list[Path]) -> set[Path]:
    """The application folders the workers hold (one per application run there)."""
    return {d for w in work_dirs for d in w.glob("app-*") if d.is_dir()}


def _assert_executors_ran_the_packed_python(work_dirs: list[Path], earlier: set[Path]) -> None:
    """Matching ran in executors that the workers launched as separate processes,
    in the Python of the archive Spark unpacked in each executor's folder; only the
    applications started since ``earlier`` (the cluster is the module's) count."""
    from streaming import pack

    executors = [d for app in _applications(work_dirs) - earlier for d in app.iterdir()
                 if d.is_dir()]
    assert len(executors) >= 2, executors
    unpacked = [d / pack.ENVIRONMENT for d in executors]
    assert all((env / "bin" / "python").exists() for env in unpacked), unpacked
    # The archive holds bitroute's sources without bytecode: a __pycache__ of the
    # routing code there is the workers' Python having imported it from the archive.
    compiled = [env for env in unpacked
                if list(env.glob("lib/python3.*/site-packages/streaming/router/__pycache__/*.pyc"))]
    assert compiled, unpacked


CLUSTER_SETTINGS = {
    "spark.options.spark.executor.memory": "512m",
    # Every batch through the executors' Python workers, none routed in the driver.
    "streaming.driver_route_max_publishes": "0",
}
"""(A cluster master: ``streaming.executor_audit_files = "auto"`` has the tasks write the
audit files.)"""


def _subscribe_gamma_and_delta(config: Config) -> None:
    """The subscriptions :func:`_route_on` routes to."""
    client.subscribe(config, "amq.topic", "gamma", "stock.*.nyse", sub_id="g1")
    client.subscribe(config, "mqtt", "delta", "sensors/+/temp", sub_id="d1")


def _route_on(config: Config, router: RouterProcess) -> tuple[list[str], Counter, Counter]:
    """Publish 41 messages (40 matching) through a started router; stop it; return
    the publishes' ids and what gamma and delta received."""
    try:
        router.wait_for(re.compile(r"snapshot v\d+ with 2 subscriptions"))
        ids = publish_keys(config, [("amq.topic", f"stock.s{i}.nyse") for i in range(20)]
                       + [("mqtt", f"sensors/s{i}/temp") for i in range(20)]
                       + [("amq.topic", "sensors.x.temp")])
        gamma = _delivered(config, "gamma", set(ids[:20]))
        delta = _delivered(config, "delta", set(ids[20:40]))
    except BaseException:
        router.kill()
        raise
    return ids, gamma, delta


@pytest.fixture(scope="module")
def s3_cluster(tmp_path_factory: pytest.TempPathFactory, s3: S3Server
               ) -> Iterator[tuple[S3Server, str, list[Path]]]:
    """The session's S3 server and one standalone cluster (its hosts with the server's
    credentials) for this module's cluster tests: the cluster's start is paid once. Each
    test's application ends with the test (its router stopped or killed), freeing the
    workers' cores."""
    root = tmp_path_factory.mktemp("cluster")
    with standalone_cluster(root, environ=s3.environ) as (master, work_dirs):
        yield s3, master, work_dirs


def test_the_router_routes_on_a_standalone_cluster_with_matching_on_executors(
        base_config: Config, tmp_path: Path, s3_cluster):
    """`bitroute run --set spark.master=spark://...` as docs/running.md gives it: the
    executors get bitroute from the application (bitroute pack, spark.archives), route
    every batch and write its audit files into an object-store warehouse (a real S3
    server on loopback, the credentials in the hosts' environment only); the driver
    commits them; a second router on the same topic and warehouse is refused."""
    _assert_workers_python_is_bare(tmp_path)
    s3, master, work_dirs = s3_cluster
    earlier = _applications(work_dirs)
    settings = isolated_settings(base_config, tmp_path, **{"spark.master": master},
                                 **CLUSTER_SETTINGS, **{"delta.warehouse": s3.warehouse("cluster"),
                                                        "audit.commit_interval": "500 milliseconds"})
    config = load(overrides=settings, environ={})
    _subscribe_gamma_and_delta(config)
    driver_env = {**_driver_environment(), **s3.environ}
    bitroute = str(Path(sys.executable).parent / "bitroute")
    router = RouterProcess(settings, tmp_path / "router.log", command=[bitroute, "run"],
                           env=driver_env)
    ids, gamma, delta = _route_on(config, router)
    try:
        other = {**settings, "streaming.checkpoint_dir": str(tmp_path / "other")}
        second = subprocess.run(
            [bitroute, "run", *(a for k, v in other.items() for a in ("--set", f"{k}={v}"))],
            env=driver_env, capture_output=True, text=True, timeout=600)
        assert second.returncode == 1, second.stderr[-2000:]
        assert second.stderr.strip().splitlines()[-1].startswith(
            "bitroute: error: cannot start the router: another router routes "
            f"{settings['kafka.publishes_topic']} into {settings['delta.warehouse']}: "
            "router "), second.stderr[-2000:]
        audited = wait_until(lambda: _s3_audit(settings, driver_env, len(ids)),
                             "every publish audited on S3", timeout=120)
    finally:
        status = router.terminate()  # kills it if it does not stop
    assert status == 0
    assert set(gamma) == set(ids[:20]) and set(delta) == set(ids[20:40])
    assert audited == set(zip(ids[:40], ["gamma"] * 20 + ["delta"] * 20, strict=True))
    batches = [line for line in router.seen if line.startswith("batch ")]
    assert batches and all("routed in the executors" in line for line in batches), batches
    _assert_executors_ran_the_packed_python(work_dirs, earlier)
    assert s3.environ["AWS_SECRET_ACCESS_KEY"] not in (tmp_path / "router.log").read_text()


def _s3_audit(settings: dict[str, str], env: dict[str, str], publishes: int) -> set | None:
    """The (message, subscriber) pairs of the deliveries table, read with `bitroute audit`
    as a user would, once the messages table holds every publish (else None)."""
    def rows(table: str) -> list[dict]:
        result = subprocess.run(
            [str(Path(sys.executable).parent / "bitroute"), "audit", table, "--json",
             *(a for k, v in settings.items() for a in ("--set", f"{k}={v}"))],
            env=env, capture_output=True, text=True, timeout=120)
        return [json.loads(line) for line in result.stdout.splitlines()] if not result.returncode \
            else []
    if len(rows("messages")) < publishes:
        return None
    pairs = [(r["message_id"], r["subscriber"]) for r in rows("deliveries")]
    assert len(pairs) == len(set(pairs)), "a (message, subscriber) audited twice"
    return set(pairs)


SUBMIT = Path(__file__).resolve().parents[3] / "docker" / "submit.sh"


def _submit_environment(settings: dict[str, str]) -> dict[str, str]:
    """The router host's environment with ``settings`` as BITROUTE_* variables, as
    docs/running.md gives them to docker/submit.sh."""
    env = _driver_environment()
    env.update({f"BITROUTE_{key.replace('.', '_').upper()}": value
                for key, value in settings.items()})
    env["SPARK_DRIVER_HOST"] = "127.0.0.1"
    return env


def _submitted(base_config: Config, tmp_path: Path, master: str, **extra: str
               ) -> tuple[Config, RouterProcess]:
    """docker/submit.sh started on ``master`` with this test's settings (``extra`` on top)
    in BITROUTE_* variables, gamma and delta subscribed first: its config and router."""
    settings = isolated_settings(base_config, tmp_path, **extra)
    del settings["spark.master"]  # spark-submit's --master rules
    config = load(overrides=settings, environ={})
    _subscribe_gamma_and_delta(config)
    return config, RouterProcess(CLUSTER_SETTINGS, tmp_path / "router.log",
                                 command=[str(SUBMIT), master],
                                 env=_submit_environment(settings), cwd=tmp_path)


def test_docker_submit_sh_submits_the_router_to_a_standalone_cluster(
        base_config: Config, tmp_path: Path, s3_cluster):
    """docker/submit.sh as docs/running.md shows it: the settings in BITROUTE_*
    variables, no Python named; pyspark's spark-submit starts the driver. (The
    module's cluster: its hosts also hold an object store's credentials, unused here.)"""
    _assert_workers_python_is_bare(tmp_path)
    _, master, work_dirs = s3_cluster
    earlier = _applications(work_dirs)
    config, router = _submitted(base_config, tmp_path, master)
    ids, gamma, delta = _route_on(config, router)
    # SIGTERM reaches spark-submit's JVM and the Python driver alike (its
    # process group, as Ctrl-C does): the stop may be abrupt, and safe.
    os.killpg(router.process.pid, signal.SIGTERM)
    try:
        router.process.wait(timeout=120)
    finally:
        with suppress(ProcessLookupError):  # nothing of the group left
            router.kill()
    assert set(gamma) == set(ids[:20]) and set(delta) == set(ids[20:40])
    _assert_executors_ran_the_packed_python(work_dirs, earlier)


REALTIME_SETTINGS = {
    "streaming.mode": "realtime",
    # A routing task per partition for as long as the query runs, and the other of the
    # cluster's two slots for the audit query's batches.
    "kafka.partitions": "1",
    "audit.commit_interval": "500 milliseconds",
}


def test_realtime_mode_refuses_a_cluster_with_fewer_task_slots_than_it_holds(
        base_config: Config, tmp_path: Path, s3_cluster):
    """Two partitions need three slots (two routing tasks and the audit's) and the
    cluster's two one-core workers have two: `bitroute run` on the cluster master says so
    in one line, counting the executors' slots (not spark.default.parallelism), once
    Spark's registration window (5 s here) has passed."""
    _, master, _ = s3_cluster
    settings = isolated_settings(base_config, tmp_path, **{
        **CLUSTER_SETTINGS, **REALTIME_SETTINGS, "spark.master": master,
        "kafka.partitions": "2", "spark.shuffle_partitions": "8",
        "spark.options.spark.scheduler.maxRegisteredResourcesWaitingTime": "5s"})
    refused = subprocess.run(
        [str(Path(sys.executable).parent / "bitroute"), "run",
         *(a for k, v in settings.items() for a in ("--set", f"{k}={v}"))],
        env=_driver_environment(), capture_output=True, text=True, timeout=600)
    assert refused.returncode == 1, refused.stderr[-2000:]
    # The JVM may log after it (executors still fetching the application's files).
    [error] = [line for line in refused.stderr.splitlines() if line.startswith("bitroute: error")]
    assert re.fullmatch(
        r"bitroute: error: cannot start the router: realtime mode needs a task slot per "
        rf"partition of {settings['kafka.publishes_topic']} \(2\) plus one for the audit, and "
        rf"Spark has [0-2] \({re.escape(master)}\): give Spark more cores .*", error), error


def test_realtime_mode_routes_on_a_standalone_cluster_with_its_jar_from_submit_sh(
        base_config: Config, tmp_path: Path, s3_cluster):
    """docker/submit.sh with streaming.mode = "realtime": spark-submit's --jars carries
    bitroute-realtime.jar (the route function's classes and the kernel's JNI library) to
    the driver, whose py4j finds RouteUdf, and to the executors, whose long tasks match
    every publish; the workers have nothing of bitroute. Deliveries arrive through raw
    Kafka with their message ids, and the driver's audit query lands one messages row
    per publish and one deliveries row per (message, subscriber) in Delta."""
    _assert_workers_python_is_bare(tmp_path)
    _, master, work_dirs = s3_cluster
    earlier = _applications(work_dirs)
    config, router = _submitted(base_config, tmp_path, master, **REALTIME_SETTINGS)
    try:
        ids, gamma, delta = _route_on(config, router)
        messages = wait_until(lambda: _complete(_audit_counts(
            config, "messages", ["message_id", "outcome"]), len(ids)),
            "a messages row per publish", timeout=120)
        deliveries = _audit_counts(config, "deliveries", ["message_id", "subscriber"])
    finally:
        with suppress(ProcessLookupError):
            router.kill()
    assert any(line.startswith("bitroute: mode realtime") for line in router.seen), router.seen
    assert set(gamma) == set(ids[:20]) and set(delta) == set(ids[20:40])
    assert messages == Counter({**{(m, "routed"): 1 for m in ids[:40]},
                                (ids[40], "unroutable"): 1})
    assert deliveries == Counter(zip(ids[:40], ["gamma"] * 20 + ["delta"] * 20, strict=True))
    # The executors (launched by the bare workers) fetched the jar with the application.
    executors = [d for app in _applications(work_dirs) - earlier for d in app.iterdir()
                 if d.is_dir()]
    assert executors and all((d / "bitroute-realtime.jar").is_file() for d in executors), \
        executors


def _complete(counts: Counter, expected: int) -> Counter | None:
    """``counts`` once it holds ``expected`` keys (else None)."""
    return counts if len(counts) >= expected else None
