"""The SparkSession factory: the Kafka connector and Delta Lake work in one session."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Producer


def test_spark_reads_kafka_and_round_trips_delta(spark, kafka_bootstrap: str, new_topic,
                                                 tmp_path: Path):
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
    table = str(tmp_path / "delta-table")
    frame.write.format("delta").save(table)

    back = spark.read.format("delta").load(table)
    rows = sorted((r.key, r.value, r.headers[0].value) for r in back.collect())
    assert rows == sorted((f"k{i}", f"v{i}", str(i).encode()) for i in range(10))
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()
    assert [h.operation for h in history] == ["WRITE"]


def test_session_has_the_configured_settings(spark):
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    assert "DeltaSparkSessionExtension" in spark.conf.get("spark.sql.extensions")


def test_spark_works_in_the_state_folder_not_the_current_one(spark, base_config, workdir,
                                                             tmp_path_factory):
    """Spark 4.0 puts ``artifacts/`` in its JVM's working folder and ``spark-warehouse/``
    in the current one: both belong under ``<streaming.checkpoint_dir>/spark``."""
    state = base_config.streaming.checkpoint_dir / "spark"
    spark.range(3).write.format("delta").save(str(tmp_path_factory.mktemp("delta") / "t"))
    spark.sql("CREATE DATABASE bitroute_session_test")  # a database is a warehouse folder
    try:
        assert list(workdir.iterdir()) == []
        assert spark.sparkContext._jvm.java.lang.System.getProperty("user.dir") == str(state)
        assert [p.name[:6] for p in (state / "artifacts").iterdir()] == ["spark-"]
        assert (state / "warehouse" / "bitroute_session_test.db").is_dir()
    finally:
        spark.sql("DROP DATABASE bitroute_session_test")
