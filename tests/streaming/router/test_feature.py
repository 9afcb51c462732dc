"""streaming.router.feature: the interface a feature plugs into the router's batch loop through."""

from __future__ import annotations

import pytest

from streaming.config import load
from streaming.router.errors import RetentionGapError
from streaming.router.feature import STOP_RETENTION_GAP, BatchFeature, BatchStep, StopReason
from streaming.router.topics.retention import RetentionFeature, RetentionWatch


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
