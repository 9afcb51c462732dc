"""streaming.router.feature: the interface a feature plugs into the router's batch loop through,
and streaming.router.features: the router's features, in order."""

from __future__ import annotations

import pytest

from router_runs import create_publishes, delivered_ids, publish, subscribe
from streaming.config import load
from streaming.router.errors import RetentionGapError
from streaming.router.feature import (
    STOP_RETENTION_GAP,
    BatchFeature,
    BatchPin,
    BatchStep,
    IdleCatchUp,
    RouterContext,
    StopReason,
)
from streaming.router.features import FEATURES
from streaming.router.replay.replay import ReplayFeature
from streaming.router.retained import RetainedFeature
from streaming.router.service import Router
from streaming.router.topics.incarnations import IncarnationFeature
from streaming.router.topics.retention import RetentionFeature, RetentionWatch
from waiting import wait_until


class _Counting(BatchFeature):
    """A feature that records the batches it saw and what earlier features left."""

    name = "counting"

    def __init__(self) -> None:
        self.seen: list[tuple[int, bool]] = []
        self.closed = False

    def step(self, batch: BatchStep) -> None:
        self.seen.append((batch.batch_id, batch.topic_present))

    def close(self) -> None:
        self.closed = True


class _Missing(BatchFeature):
    """A feature that finds the publishes topic missing, through the batch's retry."""

    def step(self, batch: BatchStep) -> None:
        batch.topic_present = batch.retrying("the check", lambda: False)


class _Stopping(BatchFeature):
    def step(self, batch: BatchStep) -> None:
        self.stop_reason = StopReason(STOP_RETENTION_GAP, f"batch {batch.batch_id}: gone")
        raise RetentionGapError("gone")


def _run(features: list[BatchFeature], batch_id: int = 7) -> tuple[BatchStep, list[str]]:
    stages: list[str] = []

    def retrying(stage, work):
        stages.append(stage)
        return work()

    step = BatchStep(batch_id, {0: 5}, {0: 9}, retrying)
    for feature in features:
        feature.step(step)
    return step, stages


def test_features_run_in_order_through_the_batch_retry_and_later_ones_read_earlier_results():
    counting = _Counting()
    step, stages = _run([_Missing(), counting])
    assert stages == ["the check"]
    assert counting.seen == [(7, False)] and step.gaps == []
    counting.close()
    assert counting.closed


def test_a_stopping_feature_raises_with_its_typed_reason_and_the_rest_do_not_run():
    stopping, after = _Stopping(), _Counting()
    with pytest.raises(RetentionGapError):
        _run([stopping, after], batch_id=3)
    assert stopping.stop_reason == StopReason(STOP_RETENTION_GAP, "batch 3: gone")
    assert after.seen == []


def test_the_retention_feature_skips_a_batch_whose_topic_is_missing_or_start_unknown():
    """No Kafka needed: a batch that reads nothing of the topic has no gap to look for."""
    config = load(None)
    watch = RetentionWatch(config.kafka.client_settings, "never-asked", "stop")
    feature = RetentionFeature(watch, lambda: 0)
    step, stages = _run([_Missing(), feature])
    assert stages == ["the check"] and step.gaps == [] and feature.stop_reason is None
    unknown = BatchStep(1, None, None, lambda stage, work: pytest.fail("asked Kafka"))
    feature.step(unknown)
    assert unknown.gaps == []
    feature.close()


class _Recording(BatchFeature):
    """A stand-in feature that writes each hook it gets to a shared log (its idle hook, run
    by another thread, to a log of its own); its first ``fail_prepare`` prepares fail."""

    def __init__(self, name: str, log: list, idle_log: list, fail_prepare: int = 0) -> None:
        self.name = name
        self.log = log
        self.idle_log = idle_log
        self.fail_prepare = fail_prepare
        self.context: RouterContext | None = None

    def open(self, router: RouterContext) -> None:
        self.context = router
        self.log.append((self.name, "open", None))

    def start(self) -> None:
        self.log.append((self.name, "start", None))

    def prepare(self, pin: BatchPin) -> None:
        self.log.append((self.name, "prepare", (pin.batch_id, pin.version)))
        if self.fail_prepare:
            self.fail_prepare -= 1
            raise OSError("a stand-in failure that is not about a record")

    def pinned(self, pin: BatchPin) -> None:
        self.log.append((self.name, "pinned", (pin.batch_id, pin.version)))

    def step(self, batch: BatchStep) -> None:
        self.log.append((self.name, "step", (batch.batch_id, batch.topic_present, batch.gaps)))

    def idle(self, idle: IdleCatchUp) -> None:
        self.idle_log.append((self.name, idle.version, idle.next_batch, idle.next_start))

    def close(self) -> None:
        self.log.append((self.name, "close", None))


def test_a_router_runs_its_listed_features_hooks_in_order_and_idle_between_batches(
        isolated_config, spark):
    """A real router with a stand-in feature before and after the registry's: each hook in
    the listed order (closes backwards), a new batch's prepare inside its retried catch-up
    and before its pin, the pinned version at the pin, the steps after the topic's checks;
    with no batch running, a new subscription applied by the idle catch-up and handed to the
    features with the next batch it bounds."""
    config = isolated_config()
    create_publishes(config, 1)
    subscribe(config, "ann", "g/#")
    published = publish(config, 0, 3)
    log: list = []
    idle_log: list = []
    first = _Recording("first", log, idle_log, fail_prepare=1)
    last = _Recording("last", log, idle_log)
    router = Router(config, spark, features=(lambda _: first, *FEATURES, lambda _: last))
    router.start()
    try:
        router.process_all_available()
        assert [type(f) for f in router.features] == [
            _Recording, RetainedFeature, ReplayFeature, IncarnationFeature, RetentionFeature,
            _Recording]
        assert router.feature(RetentionFeature) is router.features[4]
        assert first.context is not None and first.context is last.context
        assert first.context.subscription_sync is router.subscription_sync
        (report,) = router.reports
        assert (report.batch_id, report.rows) == (0, 3)
        version = report.snapshot_version
        assert log == [
            ("first", "open", None), ("last", "open", None),
            ("first", "start", None), ("last", "start", None),
            # The failure is retried with the catch-up, before anything is pinned.
            ("first", "prepare", (0, version)), ("first", "prepare", (0, version)),
            ("last", "prepare", (0, version)),
            ("first", "pinned", (0, version)), ("last", "pinned", (0, version)),
            ("first", "step", (0, True, [])), ("last", "step", (0, True, [])),
        ]
        assert delivered_ids(config, "ann") == set(published)

        subscribe(config, "bob", "g/#")  # no publish follows: the idle catch-up applies it
        applied = wait_until(lambda: next((i for i, entry in enumerate(idle_log)
                                           if entry[0] == "last" and entry[1] > version), None),
                             "the idle catch-up to hand the new version to the features", 60)
        # Batch 0 is pinned: the next batch is 1, starting where batch 0 ended.
        assert idle_log[applied] == ("last", version + 1, 1, {0: 3})
        assert idle_log[applied - 1] == ("first", version + 1, 1, {0: 3})
        assert len(log) == 11  # no batch ran meanwhile
    finally:
        router.stop()
    assert log[11:] == [("last", "close", None), ("first", "close", None)]
