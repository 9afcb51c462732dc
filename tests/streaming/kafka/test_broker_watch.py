"""A Kafka outage is reported in two lines, not one per reconnection attempt: a real
client pointed at a port where the broker is down, then started there."""

from __future__ import annotations

import logging
from pathlib import Path

from streaming import kafka
from streaming.errors import one_line
from streaming.kafka.broker import EmbeddedBroker, free_port
from streaming.kafka.broker_watch import BrokerWatch
from waiting import wait_until


def test_an_outage_is_one_line_and_its_end_another(tmp_path: Path, caplog):
    caplog.set_level(logging.INFO, logger="streaming.kafka.broker_watch")
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    watch = BrokerWatch(bootstrap)

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "streaming.kafka.broker_watch"]

    consumer = kafka.consumer(watch.settings, "watch", {"reconnect.backoff.ms": 100,
                                                        "reconnect.backoff.max.ms": 200},
                              on_error=watch.on_error)
    try:
        def polled(check):
            """Poll once (polling drives the connection attempts and their error
            callbacks), then ``check()``."""
            consumer.poll(0.2)
            return check()

        wait_until(lambda: polled(lambda: watch.down), "the watch reporting Kafka down", 20)
        for _ in range(10):  # two more seconds of failed attempts: no more lines
            consumer.poll(0.2)
        assert len(lines()) == 1
        assert f"Kafka at {bootstrap} is unreachable" in lines()[0]

        broker = EmbeddedBroker(tmp_path / "kafka", port=port, controller_port=free_port())
        broker.start()
        try:
            wait_until(lambda: polled(lambda: not watch.down), "the watch reporting Kafka back", 60)
        finally:
            broker.stop()
    finally:
        consumer.close()
    assert len(lines()) == 2, lines()
    assert "answers again after" in lines()[1] and "failed connection attempts" in lines()[1]
    assert watch.outages == 1


def test_a_stopped_watch_ends_its_probe_during_an_outage(caplog):
    """The router's stop ends the watch, even while Kafka is away."""
    caplog.set_level(logging.INFO, logger="streaming.kafka.broker_watch")
    watch = BrokerWatch(f"127.0.0.1:{free_port()}")
    consumer = kafka.consumer(watch.settings, "watch", {"reconnect.backoff.ms": 100},
                              on_error=watch.on_error)
    try:
        wait_until(lambda: consumer.poll(0.2) is None and watch.down,
                   "the watch reporting Kafka down", 20)
        prober = watch._prober
        assert prober is not None and prober.is_alive()
        watch.stop()
        assert not prober.is_alive()
        outages = watch.outages
        for _ in range(5):
            consumer.poll(0.2)
        assert watch.outages == outages  # a stopped watch reports nothing new
    finally:
        consumer.close()
    assert not any("answers again" in r.getMessage() for r in caplog.records)


def test_a_spark_failure_is_summed_up_in_its_python_error_line():
    text = """An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "/x/pyspark/sql/utils.py", line 120, in call
    raise e
pyspark.errors.exceptions.captured.StreamingQueryException: [STREAM_FAILED] Query [id = 1] terminated
  File "/work/streaming/router/subscriptions/changelog.py", line 200, in read_to_end
streaming.router.subscriptions.changelog.ChangelogError: changelog 'subs' partition 0 ends at 3 but was read to 9
"""
    assert one_line(text) == ("streaming.router.subscriptions.changelog.ChangelogError: changelog 'subs' partition 0 "
                              "ends at 3 but was read to 9")
    assert one_line("just one line\nand more") == "just one line"
    assert one_line("") == "no reason given"
