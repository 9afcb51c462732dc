"""What the router's streaming query reports through Spark's listener: whether it runs,
its rates, its last trigger's durations, its input lag.

Input lag is what the last progress event of the query says: per publishes
topic, the sum over partitions of the source's ``latestOffset`` (the end
offsets Kafka reported when that batch was planned) minus its ``endOffset``
(where the batch stopped, e.g. at ``streaming.max_offsets_per_trigger``). An
idle event (no new data at a trigger) sets it to 0. While a batch runs no
event comes: ``bitroute_last_batch_timestamp_seconds`` tells how old the
figure is.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pyspark.sql.streaming.listener import StreamingQueryListener

if TYPE_CHECKING:
    from streaming.ops.metrics import RouterMetrics


def input_lag(sources: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Per Kafka topic, records between a source's ``endOffset`` and ``latestOffset``.

    Offsets are the Kafka source's JSON (``{"topic": {"partition": offset}}``)
    as strings; a source whose offsets are missing or not of that form (the
    first trigger, another kind of source) is left out. A partition absent
    from ``endOffset`` counts from offset 0.
    """
    lags: dict[str, int] = {}
    for source in sources:
        end, latest = _offsets(source.get("endOffset")), _offsets(source.get("latestOffset"))
        if end is None or latest is None:
            continue
        for topic, partitions in latest.items():
            done = end.get(topic, {})
            lags[topic] = lags.get(topic, 0) + sum(max(offset - done.get(p, 0), 0)
                                                   for p, offset in partitions.items())
    return lags


def _offsets(text: object) -> dict[str, dict[str, int]] | None:
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    out: dict[str, dict[str, int]] = {}
    for topic, partitions in value.items():
        if not isinstance(partitions, dict) or not all(
                isinstance(o, int) and not isinstance(o, bool) for o in partitions.values()):
            return None
        out[topic] = dict(partitions)
    return out


class QueryListener(StreamingQueryListener):
    """Feeds a :class:`RouterMetrics` from its query's events. Spark calls these on its
    listener thread, after the events happened."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self._metrics = metrics

    def onQueryStarted(self, event: Any) -> None:
        self._metrics.set_query_active(True)

    def onQueryProgress(self, event: Any) -> None:
        self._metrics.record_progress(event.progress)

    def onQueryIdle(self, event: Any) -> None:
        self._metrics.record_idle()

    def onQueryTerminated(self, event: Any) -> None:
        self._metrics.set_query_active(False)
