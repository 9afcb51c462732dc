"""The SparkSession factory: the Kafka connector and Arrow work in one session.

The session holds no Delta Lake (the audit tables are delta-rs's, see
audit/test_queries.py and router/test_service.py); what it must do is what the router asks of
it: read Kafka with headers and run Python over Arrow batches in its workers.
"""

from __future__ import annotations

from confluent_kafka import Producer


def test_spark_reads_kafka_with_headers_and_maps_it_in_arrow(spark, kafka_bootstrap: str,
                                                             new_topic):
    topic = new_topic(partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(10):
        producer.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode(),
                         headers=[("n", str(i).encode())])
    assert producer.flush(30) == 0

    frame = (spark.read.format("kafka")
             .option("kafka.bootstrap.servers", kafka_bootstrap)
             .option("subscribe", topic)
             .option("startingOffsets", "earliest")
             .option("includeHeaders", "true")
             .load()
             .selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value",
                         "headers"))

    def upper(batches):  # runs in a Python worker, as the router's matching does
        import pyarrow.compute as pc
        for batch in batches:
            yield batch.set_column(1, "value", pc.utf8_upper(batch.column("value")))

    back = frame.mapInArrow(upper, frame.schema).collect()
    rows = sorted((r.key, r.value, r.headers[0].value) for r in back)
    assert rows == sorted((f"k{i}", f"V{i}", str(i).encode()) for i in range(10))


def test_session_has_the_configured_settings(spark):
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    # No Delta extension or catalog: Spark never reads or writes the audit tables.
    assert spark.conf.get("spark.sql.extensions", None) is None
    assert "delta" not in spark.conf.get("spark.sql.catalog.spark_catalog", "").lower()


def test_spark_works_in_the_state_folder_not_the_current_one(spark, base_config, workdir,
                                                             tmp_path_factory):
    """The JVM works in ``<streaming.checkpoint_dir>/spark`` (Spark 4.0 put ``artifacts/``
    in its working folder) and the SQL warehouse is there (Spark's default is
    ``spark-warehouse/`` in the current folder): the current folder stays empty."""
    state = base_config.streaming.checkpoint_dir / "spark"
    spark.range(3).write.parquet(str(tmp_path_factory.mktemp("parquet") / "t"))
    spark.sql("CREATE DATABASE bitroute_session_test")  # a database is a warehouse folder
    try:
        assert list(workdir.iterdir()) == []
        assert spark.sparkContext._jvm.java.lang.System.getProperty("user.dir") == str(state)
        assert (state / "warehouse" / "bitroute_session_test.db").is_dir()
    finally:
        spark.sql("DROP DATABASE bitroute_session_test")


def test_the_replays_scheduler_pool_is_configured_before_any_replay(spark):
    """The replay's pool (streaming.router.replay.replay.SCHEDULER_POOL) comes from
    conf/fairscheduler.xml with weight 1 and minShare 0, as the live batches' default pool:
    Spark knows it before a job asks for it (an unknown pool is made up at the first job,
    with the warning "which has not been configured")."""
    from streaming.router.replay.replay import SCHEDULER_POOL
    from streaming.session import FAIR_SCHEDULER_POOLS

    assert spark.sparkContext.getConf().get("spark.scheduler.allocation.file") == str(
        FAIR_SCHEDULER_POOLS)
    scheduler = spark.sparkContext._jsc.sc()
    assert scheduler.getSchedulingMode().toString() == "FAIR"
    found = scheduler.getPoolForName(SCHEDULER_POOL)
    assert found.isDefined(), f"Spark has no pool {SCHEDULER_POOL!r}"
    pool = found.get()
    assert (pool.weight(), pool.minShare(), pool.schedulingMode().toString()) == (1, 0, "FIFO")
