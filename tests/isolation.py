"""A test's own corner of the shared broker and disk: its own topics (a random tag in
every name) and its own warehouse and checkpoints under a folder of its own.

conftest.py's ``isolated_settings`` and ``isolated_config`` fixtures are the factories
tests use; these functions are for fixtures of a wider scope (module) that cannot use
them.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from streaming.config import Config, load


def isolated_settings(base: Config, root: Path, **extra: str) -> dict[str, str]:
    """``--set`` style settings: ``base``'s broker, fresh topic names, the warehouse and
    checkpoints under ``root``, a local Spark sized for the test machine; ``extra``
    (keys with dots, e.g. ``**{"audit.mode": "journal"}``) on top."""
    tag = uuid.uuid4().hex[:10]
    return {
        "kafka.bootstrap": base.kafka.bootstrap,
        "kafka.publishes_topic": f"pub-{tag}",
        "kafka.subscriptions_topic": f"subs-{tag}",
        "kafka.rejected_topic": f"rej-{tag}",
        "kafka.retained_topic": f"ret-{tag}",
        "kafka.routing_view_topic": f"view-{tag}",
        "kafka.routed_topic": f"routed-{tag}",
        "kafka.deliveries_topic_prefix": f"dlv-{tag}.",
        "broker.embedded": "false",
        "delta.warehouse": str(root / "delta"),
        "streaming.checkpoint_dir": str(root / "checkpoints"),
        "streaming.trigger_interval": "200 milliseconds",
        "spark.master": "local[2]",
        "spark.shuffle_partitions": "2",
        "spark.log_level": "ERROR",
        **extra,
    }


def isolated_config(base: Config, root: Path, **extra: str) -> Config:
    """The :class:`Config` of :func:`isolated_settings` (no file, no environment)."""
    return load(overrides=isolated_settings(base, root, **extra), environ={})
