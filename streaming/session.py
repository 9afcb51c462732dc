"""The SparkSession factory: the Kafka connector and Arrow, configured once.

The router's session holds no Delta Lake: the router appends its audit rows and
``bitroute audit`` reads them with delta-rs (:mod:`streaming.audit.writer`,
:mod:`streaming.audit.queries`), so that session needs neither Delta's jars nor its SQL
extension and catalog. ``bitroute sql`` (:mod:`streaming.audit.sql`) builds its own
session through the same factory, with the ``delta`` jars and Delta's two settings.

``spark_session(config)`` returns the active session when one exists (under
``spark-submit`` the master and jars come from the submitter, and only the
settings below that are not already set are added), else builds one on
``spark.master`` (``local[*]`` by default) with the jars of ``conf/jvm.toml``
resolved by :mod:`streaming.jvm` and handed to Spark as ``spark.jars``, so a
cluster's executors receive them too. With a cluster master, in both cases, the
executors' Python comes with the application (:func:`executor_python`).

A JVM that bitroute launches works in ``<streaming.checkpoint_dir>/spark/``
(:func:`jvm_folder`), with Spark's SQL warehouse in ``warehouse/`` there: whatever
the JVM writes to a relative path lands there (Spark 4.0 put each session's
``artifacts/`` in its working folder; 4.2 makes them in a temporary folder), and
nothing may land in the folder bitroute was started from.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession

import conf
from streaming import jvm
from streaming.config import MODE_REALTIME, Config
from streaming.kafka.settings import SPARK_REDACTION_REGEX
from streaming.state.checkpoint import CheckpointLayout

_log = logging.getLogger(__name__)

LOG4J2_CONFIG = Path(conf.__file__).parent / "spark-log4j2.properties"
"""The Spark JVM's logging: to stderr; the Kafka clients' reconnection warnings and the
trigger's "Current batch is falling behind" (one per batch over the interval) off."""
CLUSTER_DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""Added to the driver JVM bitroute launches for a cluster master: there the driver only
plans and schedules (the executors route), and the C2 compiler and a parallel collector
were most of its CPU per batch: 0.68 -> 0.42 s per batch of 300,000 deliveries
(docs/benchmarks-history.md, "Driver cost on a cluster")."""
FAIR_SCHEDULER_POOLS = Path(conf.__file__).parent / "fairscheduler.xml"
"""The FAIR scheduler's pools (``spark.scheduler.allocation.file``): the replay's,
:data:`streaming.router.replay.replay.SCHEDULER_POOL`, with its weight and minShare."""
LOCAL_DRIVER_MEMORY = "4g"
"""Heap of the JVM bitroute launches for a ``local[...]`` master (``spark.options`` may override)."""


def session_settings(config: Config) -> dict[str, str]:
    """Every Spark setting bitroute relies on, with ``spark.options`` applied last."""
    settings = {
        "spark.app.name": config.spark.app_name,
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.shuffle.partitions": str(config.spark.shuffle_partitions),
        "spark.default.parallelism": str(config.spark.shuffle_partitions),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # Streaming queries run for days; keep only recent progress in memory.
        "spark.sql.streaming.numRecentProgressUpdates": "20",
        "spark.sql.session.timeZone": "UTC",
        # Replays (subscribe --since) read in their own pool beside the live batches'
        # jobs, which a FIFO scheduler would queue behind them (streaming.router.replay.replay).
        "spark.scheduler.mode": "FAIR",
        "spark.scheduler.allocation.file": str(FAIR_SCHEDULER_POOLS),
        # The Kafka source's kafka.sasl.jaas.config, keys and passwords ([kafka.client])
        # are shown redacted in Spark's logs, UI and plan descriptions.
        "spark.redaction.regex": SPARK_REDACTION_REGEX,
        # The JVM's log lines go to stderr (conf/spark-log4j2.properties): stdout
        # is the router's progress and the verbs' --json output.
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
    }
    if not _under_spark_submit():
        settings["spark.sql.warehouse.dir"] = str(jvm_folder(config) / "warehouse")
    if not config.spark.master.startswith("local") and not _under_spark_submit():
        settings["spark.driver.extraJavaOptions"] += f" {CLUSTER_DRIVER_JAVA_OPTIONS}"
    if config.spark.master.startswith("local") and not _under_spark_submit():
        # Local mode serves only this machine: keep the driver on loopback.
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
        # Local mode runs every task in the driver's JVM, which bitroute
        # launches: Spark's default 1g heap spent most of a 775k-delivery
        # batch in full GCs (docs/benchmarks.md, end to end).
        settings["spark.driver.memory"] = LOCAL_DRIVER_MEMORY
    settings.update(config.spark.options)
    return settings


def session_jars(config: Config, jar_group: str) -> list[Path]:
    """The jars a session bitroute launches is given: ``jar_group``'s of conf/jvm.toml and,
    for a router's session, :func:`router_jars`."""
    if jar_group == "spark":
        return router_jars(realtime_required=config.streaming.mode == MODE_REALTIME)
    return list(jvm.jars(jar_group))


def router_jars(realtime_required: bool = False) -> list[Path]:
    """The router's jars: conf/jvm.toml's ``spark`` group and realtime mode's jar
    (:mod:`streaming.realtime.jar`, built here if need be), so that one application serves
    either mode; Spark ships them to a cluster's executors (``spark.jars``, or
    ``docker/submit.sh``'s ``--jars``). Micro-batch mode does without the realtime jar where
    it cannot be built (no JDK or cargo on this host): it is left out, unless
    ``realtime_required`` (then the build's error is raised; a realtime router given no jar
    refuses at start, :func:`streaming.realtime.query.register_route_function`)."""
    from streaming.errors import RealtimeBuildError
    from streaming.realtime.jar import realtime_jar

    jars = list(jvm.jars("spark"))
    try:
        jars.append(realtime_jar())
    except RealtimeBuildError as exc:
        if realtime_required:
            raise
        _log.debug(f"micro-batch mode without the realtime jar: {exc}")
    return jars


def local_master(config: Config) -> str:
    """The master Spark runs: ``spark.master``, except that realtime mode on ``local[*]``
    gets a task slot per publishes partition plus two (Real-Time Mode holds one slot
    per partition for as long as it runs; the audit query and Spark's own jobs need the
    rest), however few cores the machine has."""
    master = config.spark.master
    if config.streaming.mode == MODE_REALTIME and master == "local[*]":
        return f"local[{max(os.cpu_count() or 1, config.kafka.partitions + 2)}]"
    return master


def spark_session(config: Config, jar_group: str = "spark",
                  extra_settings: dict[str, str] | None = None) -> SparkSession:
    """Return the configured SparkSession (see module docstring).

    ``jar_group`` names the conf/jvm.toml group handed to Spark (the router's is
    ``spark``, the Kafka connector; ``bitroute sql`` uses ``delta``), and
    ``extra_settings`` are added on top of :func:`session_settings` (the Delta
    extension and catalog of :mod:`streaming.audit.sql`).
    """
    active = SparkSession.getActiveSession()
    settings = {**session_settings(config), **(extra_settings or {})}
    if active is not None:
        for key, value in settings.items():
            if key.startswith("spark.sql.") and active.conf.get(key, None) is None:
                active.conf.set(key, value)
        return active
    if _under_spark_submit():
        SparkContext._ensure_initialized()  # connects to spark-submit's JVM: its settings
        submitted = dict(SparkConf().getAll())
        master = submitted.get("spark.master", config.spark.master)
    else:
        submitted, master = {}, config.spark.master
    settings.update(executor_python(master, {**submitted, **settings}))
    # pyspark starts Python workers with $PYSPARK_PYTHON (not spark.pyspark.python,
    # which only spark-submit turns into that variable), else "python3" from PATH,
    # which need not be this virtualenv's interpreter (the one with pandas,
    # pyarrow and compiler/ installed). A local master's workers run here.
    if "spark.pyspark.python" in settings:
        os.environ["PYSPARK_PYTHON"] = settings["spark.pyspark.python"]
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if _under_spark_submit():
        builder = SparkSession.builder
        for key, value in settings.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
    else:
        conf = (SparkConf().setMaster(local_master(config))
                .set("spark.jars", ",".join(str(p) for p in session_jars(config, jar_group)))
                .setAll(list(settings.items())))
        gateway = None
        if SparkContext._gateway is None:  # else the JVM of a stopped session is reused
            folder = jvm_folder(config)
            folder.mkdir(parents=True, exist_ok=True)
            # pyspark's own launch, but in the folder no Spark setting can choose.
            gateway = launch_gateway(conf, popen_kwargs={"cwd": str(folder)})
        session = SparkSession(SparkContext(conf=conf, gateway=gateway))
    session.sparkContext.setLogLevel(config.spark.log_level)
    return session


def executor_python(master: str, settings: dict[str, str]) -> dict[str, str]:
    """The settings that give a cluster's executors their Python, given the others.

    With a cluster master (anything but ``local...``) the executors get bitroute,
    its kernel and its dependencies from the packed environment of
    :mod:`streaming.pack` (built on first use, then cached): ``spark.archives``
    and ``spark.pyspark.python`` inside it, the driver keeping its own interpreter
    (``spark.pyspark.driver.python``). Nothing when the master is local (the
    workers run on this machine, with this Python) or when the user chose the
    executors' Python already (``spark.pyspark.python`` or ``spark.archives`` in
    ``spark.options`` or given to spark-submit).
    """
    if master.startswith("local") or {"spark.pyspark.python", "spark.archives"} & settings.keys():
        return {}
    from streaming import pack

    packed = pack.archive()
    _log.info(f"executors run Python from {packed.path.name} ({packed.size_bytes / 1e6:.0f} MB, "
              f"spark.archives; workers need Python {sys.version.split()[0]} at "
              f"{packed.worker_python})")
    return packed.spark_settings()


def jvm_folder(config: Config) -> Path:
    """The working folder of a JVM bitroute launches: ``<streaming.checkpoint_dir>/spark``."""
    return CheckpointLayout.of(config.streaming.checkpoint_dir).jvm


def _under_spark_submit() -> bool:
    """True when spark-submit launched this process: its master and --jars then rule.

    spark-submit starts the JVM first and hands Python the gateway port in the
    environment; a plain ``python`` run has no such variable.
    """
    return "PYSPARK_GATEWAY_PORT" in os.environ
