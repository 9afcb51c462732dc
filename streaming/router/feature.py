"""The router's features as its batch loop sees them: one small interface.

:class:`~streaming.router.service.Router` is the loop (open, then per batch: pin,
route, audit, report; then close). A feature that acts on every batch plugs into
it as a :class:`BatchFeature`, and a new one is a new module added to
:meth:`Router.features <streaming.router.service.Router.features>`, not an edit of
the loop:

- :meth:`BatchFeature.step`, each batch, after its pin and before its routing,
  given the batch's :class:`BatchStep`: its id and offset range, the batch's retry
  (a failure not about a record is retried with backoff, counted in the batch's
  attempts), and what the feature leaves for the routing (the publishes topic
  missing, the retention gaps to record as ``lost`` rows);
- :attr:`BatchFeature.stop_reason`: a feature that stops the query raises from
  its step after setting it, a :class:`StopReason` whose kind says what the
  caller does (``bitroute run``: follow a recreated publishes topic, or exit with
  the reason's line);
- :meth:`BatchFeature.close`, at the router's stop (and before it follows a new
  incarnation of the publishes topic): its clients closed.

Features run in the order the router lists them: a step may read what an earlier
one left in the :class:`BatchStep`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from streaming.router.topics.retention import RetentionGap

T = TypeVar("T")

STOP_RECREATED = "publishes_topic_recreated"
"""The publishes topic was deleted and created again: the router follows the new one."""
STOP_RETENTION_GAP = "retention_gap"
"""Publishes were lost to retention under ``streaming.on_retention_gap = "stop"``."""


@dataclass(frozen=True)
class StopReason:
    """Why a feature stopped the query: its ``kind`` (one of the ``STOP_`` names) and its
    one ``line``, as the router logs it and ``bitroute run`` prints it."""

    kind: str
    line: str


@dataclass
class BatchStep:
    """One batch as the features' steps see it, and what they leave for its routing."""

    batch_id: int
    start: dict[int, int] | None
    """The batch's start offsets per partition (None when unknown: Spark's offset log)."""
    end: dict[int, int] | None
    retrying: Callable[[str, Callable[[], Any]], Any]
    """``retrying(stage, step)``: ``step()`` under the batch's retry policy, named
    ``batch <id>: <stage>`` in its failure lines."""
    topic_present: bool = True
    """False while the publishes topic is deleted and not created again."""
    gaps: list[RetentionGap] = field(default_factory=list)
    """Publishes lost to retention before this batch: recorded with its audit."""


class BatchFeature:
    """A feature of the router's batch loop (module docstring); the defaults do nothing."""

    name = "feature"
    stop_reason: StopReason | None = None

    def step(self, batch: BatchStep) -> None:
        """Act on ``batch`` before its routing; raise (after setting :attr:`stop_reason`)
        to stop the query."""

    def close(self) -> None:
        """Release what the feature holds (the router stops, or reopens its state)."""
