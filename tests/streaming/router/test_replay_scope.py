"""What a replay's routing task delivers (ReplayScope): the plan of a chunk narrowed to the
replays' ranges, without what the audit holds already, what expired, or what was rejected
live. No Kafka: the task's planning functions on an Arrow batch; Spark for the broadcast that
carries the audit's pairs to the tasks."""

from __future__ import annotations

import dataclasses
import json
import pickle

import numpy as np
import pyarrow as pa
import pytest

from arrow_batches import source_batch
from compiler import Matcher, RoutingIndex, Subscription
from schemas.records import EXPIRY_HEADER, message_id
from streaming.kafka.layout import DeliveryLayout
from streaming.router.batch.delivery import ProducerSettings
from streaming.router.batch.routing import RouteSettings, plan_batch
from streaming.router.replay.scope import ReplayScope, delivered_pairs

REPLAYS = [("ann-a", "ann", "a.*"), ("ann-b", "ann", "a.#"), ("bob-a", "bob", "a.*")]


def _matcher() -> Matcher:
    index = RoutingIndex({"amq.topic": "amqp"})
    for sid, subscriber, filt in REPLAYS:
        value = json.dumps({"exchange": "amq.topic", "subscriber": subscriber, "filter": filt})
        index.upsert(Subscription.from_changelog(sid.encode(), value.encode()))
    return Matcher(index.snapshot(3, {}))


def _scope(ranges: dict[str, tuple[int, int]], delivered: list[tuple[int, str]]) -> ReplayScope:
    ids = tuple(sid for sid, _, _ in REPLAYS)
    low = np.array([[ranges[i][0]] for i in ids], np.int64)
    high = np.array([[ranges[i][1]] for i in ids], np.int64)
    mids = pa.array([message_id("p", 0, offset) for offset, _ in delivered], pa.string())
    return ReplayScope(ids, low, high, delivered_pairs(mids, pa.array([s for _, s in delivered])),
                       ("amq.topic",))


def test_a_chunk_delivers_only_in_range_not_yet_delivered_and_alive():
    publishes: list[tuple[bytes, bytes, list[tuple[str, bytes]]]] = [
        (f"a.{i}".encode(), b"x", []) for i in range(6)]
    publishes[4] = (b"a.4", b"x", [(EXPIRY_HEADER, b"60")])  # published in 2025: expired
    publishes[5] = (b"b.5", b"x", [])  # no replay matches it
    batch = source_batch(publishes)
    scope = _scope({"ann-a": (0, 6), "ann-b": (2, 6), "bob-a": (1, 3)}, [(1, "ann"), (2, "bob")])
    settings = RouteSettings("amq.topic", DeliveryLayout("dlv.", None, 1), "rejected", 3, False,
                             ProducerSettings("127.0.0.1:9", 1_048_576), replay=scope)
    matcher = _matcher()
    assert scope.matching_keys_only(matcher, batch).column(3).to_pylist() == [
        f"a.{i}".encode() for i in range(5)]
    plan = scope.narrowed(plan_batch(matcher, batch, settings), batch)
    made = {(int(plan.owner[i]), plan.subscribers[i].as_py()): ids
            for i, ids in enumerate(plan.entries.field("subscription_ids").to_pylist())}
    assert made == {
        (0, "ann"): ["ann-a"],  # ann-b starts at offset 2
        # offset 1: ann has it (the audit); bob-a's range starts there
        (1, "bob"): ["bob-a"],
        (2, "ann"): ["ann-a", "ann-b"],  # one delivery listing both; bob had offset 2
        (3, "ann"): ["ann-a", "ann-b"],  # bob-a's range ends before offset 3
    }
    assert list(plan.send) == list(range(4))
    assert plan.reasons == [None] * 6 and plan.ok.all() and plan.retain is None
    assert [json.loads(t) for t in plan.ids_json.to_pylist()] == list(made.values())


def test_the_audits_pairs_reach_the_tasks_as_a_broadcast_released_after_the_chunk(spark):
    """A busy subscriber's audited deliveries (tens of MB) are not copied into every task's
    closure: the shipped scope pickles to the broadcast's id, the tasks read the pairs from
    the broadcast, and once released the broadcast is gone from the application."""
    n = 200_000
    pairs = delivered_pairs(pa.array([message_id("p", 0, i) for i in range(n)], pa.string()),
                            pa.array(["ann"] * n))
    scope = ReplayScope(("ann-a",), np.zeros((1, 1), np.int64), np.ones((1, 1), np.int64),
                        pairs, ("amq.topic",))
    shipped = scope.shipped(spark.sparkContext)
    assert len(pickle.dumps(scope)) > pairs.nbytes  # what each task's closure carried
    assert len(pickle.dumps(shipped)) < 10_000
    assert shipped.delivered_pairs().equals(pairs)
    context = spark.sparkContext
    counted = context.parallelize(range(2), 2).map(lambda _: len(shipped.delivered_pairs()))
    assert counted.collect() == [n, n]
    shipped.release()
    with pytest.raises(Exception, match="destroyed"):
        context.parallelize([0], 1).map(lambda _: len(shipped.delivered_pairs())).collect()
    empty = dataclasses.replace(scope, delivered=pairs.slice(0, 0))
    assert empty.shipped(context) is empty  # nothing to broadcast
