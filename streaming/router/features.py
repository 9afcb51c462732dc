"""The router's features, in the order its batch loop runs them (:mod:`streaming.router.feature`).

Each entry is a factory that makes a feature from the router's first open
(:class:`~streaming.router.feature.RouterContext`), or leaves it out (None: replays
in realtime mode). The order is every hook's order (closes run backwards), and it
is the order the loop had when these were wired by hand:

1. retained messages (:mod:`streaming.router.retained`): a batch's plan made before
   its pin, and delivered before the publishes topic's checks, so a batch that stops
   the query has delivered what its catch-up noted;
2. replays (:mod:`streaming.router.replay.replay`): bounded at a batch's pin;
3. the publishes topic's incarnation (:mod:`streaming.router.topics.incarnations`):
   a recreated topic stops the query, which follows the new one;
4. retention gaps (:mod:`streaming.router.topics.retention`): after the topic's check,
   which says whether the topic is there to check.
"""

from __future__ import annotations

from collections.abc import Callable

from streaming.router.feature import BatchFeature, RouterContext
from streaming.router.replay.replay import ReplayFeature
from streaming.router.retained import RetainedFeature
from streaming.router.topics.incarnations import IncarnationFeature
from streaming.router.topics.retention import RetentionFeature

FeatureFactory = Callable[[RouterContext], BatchFeature | None]
"""Makes a feature for a router (None: not this router's), once, at its first open."""

FEATURES: tuple[FeatureFactory, ...] = (
    RetainedFeature.of,
    ReplayFeature.of,
    IncarnationFeature.of,
    RetentionFeature.of,
)
"""The router's features, in order (module docstring)."""
