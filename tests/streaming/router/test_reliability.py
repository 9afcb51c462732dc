"""The short forms of the fault campaign (tests/reliability, docs/reliability.md)
through a real router (``bitroute run`` as a child), a real broker and real Delta tables.

Each test runs one campaign case with small sizes and asserts on its checks: every
check of the case must pass, and the figures that matter are asserted by name, so
that a case that silently did less (no kill fired, nothing rejected) fails too.

Every case but the broker kills runs on the session's broker (topics of its own),
and every JVM a case starts (its routers, a broker of its own) runs with
``short_jvm.SHORT_JVM``: the routers here live seconds between kills, and their
start is most of each test's time.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from short_jvm import short_jvm_options
from tests.reliability import cases
from tests.reliability.cases import Options

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _short_jvms(monkeypatch: pytest.MonkeyPatch) -> None:
    """The routers and brokers a case starts inherit the environment."""
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", short_jvm_options())




def test_fuzzed_bad_publishes_and_changes_are_rejected_and_good_traffic_is_delivered(
        tmp_path: Path, kafka_bootstrap: str):
    """200 bad publishes of every category and 200 bad subscription changes mixed into
    good traffic, on the session's broker (the tests run one at a time, so any topic
    that appears during the case outside its delivery namespace is the router's):
    every bad record in bitroute.rejected and the audit with a reason, every good pair
    delivered and audited once, the router never stopped."""
    result = cases.fuzz(tmp_path, Options(
        subscriptions=300, subscribers=30, fuzz_publishes=200, fuzz_changes=200,
        max_offsets=200, bootstrap=kafka_bootstrap, timeout_s=100))
    assert result.passed, result.failures()
    assert result.value("bad publishes in bitroute.rejected with a reason") == "200 of 200"
    assert result.value("bad changes in bitroute.rejected with a reason") == "200 of 200"
    categories = {k for k in result.figures["publishes_by_category"] if k.startswith("bad:")}
    assert len(categories) >= 10, categories
    assert len(result.figures["bad_changes_by_category"]) >= 14


def test_router_sigkilled_at_its_kill_points_loses_nothing_and_audits_once(
        tmp_path: Path, kafka_bootstrap: str):
    """SIGKILL after Kafka acked a batch's deliveries but before its audit was journaled,
    after the journal write but before Spark's commit, (the driver alone, its watchdog
    killing the JVM) right after a changelog catch-up persisted a snapshot version, and
    in the background committer between the two tables' commits: every pair is in Kafka,
    audited exactly once. Publishes flow until the last kill (at most 30 s of them), so
    every point meets some."""
    result = cases.kills(tmp_path, Options(
        publishes=9000, subscriptions=1000, subscribers=50, rate=300.0, max_offsets=200,
        kill_plan=(("audit", "group"), ("journaled", "group"), ("mid-audit", "group"),
                   ("catch-up", "python")), kill_after_s=(1.0, 2.0), publish_through_kills=True,
        bootstrap=kafka_bootstrap, timeout_s=100))
    assert result.passed, result.failures()
    assert result.value("kills (point, target)") == \
        "audit/group, journaled/group, mid-audit/group, catch-up/python"
    assert result.figures["summary"]["pairs"] > 1000


def test_batches_routed_on_the_executors_lose_nothing_and_audit_once_through_their_kill_points(
        tmp_path: Path, kafka_bootstrap: str):
    """Every batch routed on the executors, each task writing its audit files: a task's
    Python worker SIGKILLed after its files were written (the batch routed again, the
    files never committed), the router killed after the tasks wrote and acked but before
    the batch was journaled, after it was journaled, and between the two tables' commits
    of executor-written files: every pair is in Kafka, audited exactly once (publishes
    flow until the last kill, at most 30 s of them)."""
    result = cases.kills(tmp_path, Options(
        publishes=9000, subscriptions=1000, subscribers=50, rate=300.0, max_offsets=200,
        kill_plan=(("task-files", "worker"), ("audit", "group"), ("journaled", "group"),
                   ("mid-audit", "group")), kill_after_s=(1.0, 2.0), executors=True,
        publish_through_kills=True,
        bootstrap=kafka_bootstrap, timeout_s=100))
    assert result.passed, result.failures()
    assert result.value("kills (point, target)") == \
        "task-files/worker, audit/group, journaled/group, mid-audit/group"
    assert result.figures["summary"]["pairs"] > 1000


def test_broker_sigkilled_and_restarted_mid_run_loses_nothing_without_operator_action(
        tmp_path: Path):
    """The router's only broker SIGKILLed while publishes flow and started again 3 s
    later: the router rides it out alone, nothing is lost, the audit is exact."""
    result = cases.broker_kills(tmp_path, Options(
        publishes=4000, subscriptions=1000, subscribers=50, rate=400.0, max_offsets=500,
        broker_kills=1, down_s=3.0, broker_kill_after_s=(3.0, 5.0), timeout_s=100))
    assert result.passed, result.failures()
    assert result.value("router restarts (operator actions)") == 0
    assert len(result.figures["outages"]) == 1, "the broker was not killed exactly once"


def test_the_ledger_accounts_each_deleted_publish_by_one_lost_row_of_the_routers_format():
    """The campaign's ``lost`` kind against the rows the router writes (``gap_rows``): a
    publish Kafka deleted unread is covered by exactly one lost row, not counted missing;
    a lost row over a publish the router routed, or a deleted publish no row covers, fails."""
    from streaming.router.topics.retention import RetentionGap, gap_rows
    from tests.reliability.ledger import Ledger

    def ledger(lost_rows: list[RetentionGap]) -> dict:
        book = Ledger("t", "d.")
        for offset in range(6):
            book.add(f"t/0/{offset}", ("a",))
        assert book.lose("t/0/2") and book.lose("t/0/3") and not book.lose("t/0/9")
        book.seal()
        for offset in (0, 1, 4, 5):
            book.delivered(f"t/0/{offset}", "a")
            book.audit_delivery(f"t/0/{offset}", "a")
            book.audit_message(f"t/0/{offset}", "routed", None, 1)
        for row in gap_rows(lost_rows).to_pylist():
            book.audit_message(row["message_id"], row["outcome"], row["reason"], 0)
        return book.summary()

    exact = ledger([RetentionGap("t", 0, 2, 3, None), RetentionGap("t", 0, 3, 4, None)])
    assert (exact["lost"], exact["lost_reported"], exact["lost_unreported"],
            exact["lost_repeated"], exact["lost_rows"], exact["lost_rows_wrong"]) == (2, 2, 0, 0, 2, 0)
    assert (exact["kafka_missing"], exact["messages_missing"], exact["outcome_wrong"],
            exact["pairs"]) == (0, 0, 0, 4)
    too_wide = ledger([RetentionGap("t", 0, 1, 4, None)])
    assert (too_wide["lost_reported"], too_wide["lost_rows_wrong"]) == (2, 1)
    none = ledger([])
    assert (none["lost_unreported"], none["lost_rows"]) == (2, 0)
    twice = ledger([RetentionGap("t", 0, 2, 4, None), RetentionGap("t", 0, 3, 4, None)])
    assert twice["lost_repeated"] == 1


def test_the_campaign_reader_reads_to_an_end_behind_a_transaction_marker(kafka_bootstrap: str):
    """A partition whose last offset is a transaction's commit marker (no record is delivered
    at it) is read to its end at once, not waited on until the timeout."""
    import uuid

    from confluent_kafka import Producer

    from streaming import kafka
    from streaming.kafka.topics import create_topics
    from tests.reliability.kafka_io import read_topics

    topic = f"marker-{uuid.uuid4().hex[:8]}"
    create_topics(kafka.admin(kafka.ClientSettings.of(kafka_bootstrap)), [topic], 1, 1, {})
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": topic})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, value=str(i).encode())
    producer.commit_transaction(30)  # offsets 0-2 the records, 3 the marker: the end is 4
    values: list[bytes] = []
    started = time.monotonic()
    assert read_topics(kafka_bootstrap, [topic], lambda m: values.append(m.value()), 20) == 3
    assert values == [b"0", b"1", b"2"]
    assert time.monotonic() - started < 10
