"""The fault campaign's short forms (tests/reliability, docs/reliability.md) in realtime
mode: ``bitroute run`` with ``streaming.mode = "realtime"`` as a child, a real broker and
real Delta tables, beside the micro-batch ones of tests/streaming/router/test_reliability.py.

The checks are the campaign's (``_delivery_checks``): every publish delivered at least
once with its message id, exactly one ``messages`` row per publish and one
``deliveries`` row per (message, subscriber), bad input rejected with a reason. The
routers' publishes topic has one partition (Real-Time Mode holds a task slot per
partition, the audit query one more, on the cases' ``local[2]``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from short_jvm import short_jvm_options
from tests.reliability import cases
from tests.reliability.cases import Options

pytestmark = pytest.mark.integration
REALTIME = "realtime"


@pytest.fixture(autouse=True)
def _short_jvms(monkeypatch: pytest.MonkeyPatch) -> None:
    """The routers and brokers a case starts inherit the environment."""
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", short_jvm_options())




def test_a_realtime_router_sigkilled_mid_traffic_loses_nothing_and_audits_once(
        tmp_path: Path, kafka_bootstrap: str):
    """SIGKILL of the realtime router while publishes flow and subscriptions churn: its
    whole group after its audit query journaled a batch (Spark's commit not written), and
    its driver alone (the watchdog kills the JVM) at a random moment; restarted each
    time: every pair in Kafka, audited exactly once."""
    result = cases.kills(tmp_path, Options(
        publishes=1500, subscriptions=300, subscribers=20, rate=150.0, max_offsets=500,
        kill_plan=(("journaled", "group"), ("random", "python")), kill_after_s=(4.0, 6.0),
        bootstrap=kafka_bootstrap, timeout_s=100, mode=REALTIME))
    assert result.passed, result.failures()
    assert result.value("kills (point, target)") == "journaled/group, random/python"
    assert result.figures["summary"]["pairs"] > 200


def test_a_realtime_router_whose_audit_task_writes_the_files_sigkilled_audits_once(
        tmp_path: Path, kafka_bootstrap: str):
    """The same kills with the audit files written by the audit query's Spark task
    (``streaming.executor_audit_files = "tasks"``, a cluster's default): files of a batch
    never journaled are never committed, and nothing is audited twice or left out."""
    result = cases.kills(tmp_path, Options(
        publishes=1500, subscriptions=300, subscribers=20, rate=150.0, max_offsets=500,
        kill_plan=(("journaled", "group"), ("random", "python")), kill_after_s=(4.0, 6.0),
        bootstrap=kafka_bootstrap, timeout_s=100, mode=REALTIME, executors=True))
    assert result.passed, result.failures()
    assert result.value("kills (point, target)") == "journaled/group, random/python"
    assert result.figures["summary"]["pairs"] > 200


def test_a_broker_sigkilled_and_restarted_under_a_realtime_router_needs_no_operator(
        tmp_path: Path):
    """The realtime router's only broker SIGKILLed while publishes flow and started again
    5 s later: the routing query fails (Real-Time Mode does not retry a task) and the
    router starts it again from its checkpoint by itself; nothing is lost, the audit is
    exact, and the router was never restarted."""
    result = cases.broker_kills(tmp_path, Options(
        publishes=2000, subscriptions=300, subscribers=20, rate=200.0, max_offsets=500,
        broker_kills=1, down_s=5.0, broker_kill_after_s=(4.0, 6.0), timeout_s=120,
        mode=REALTIME))
    assert result.passed, result.failures()
    assert result.value("router restarts (operator actions)") == 0
    assert len(result.figures["outages"]) == 1, "the broker was not killed exactly once"


def test_fuzzed_bad_input_to_a_realtime_router_is_rejected_and_good_traffic_delivered(
        tmp_path: Path, kafka_bootstrap: str):
    """100 bad publishes of every category and 100 bad subscription changes mixed into
    good traffic: each bad record in the rejected topic and the audit with a reason,
    every good pair delivered and audited once, the router never stopped."""
    result = cases.fuzz(tmp_path, Options(
        subscriptions=200, subscribers=20, fuzz_publishes=100, fuzz_changes=100,
        max_offsets=200, bootstrap=kafka_bootstrap, timeout_s=100, mode=REALTIME))
    assert result.passed, result.failures()
    assert result.value("bad publishes in bitroute.rejected with a reason") == "100 of 100"
    assert result.value("bad changes in bitroute.rejected with a reason") == "100 of 100"
