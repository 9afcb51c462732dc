"""Every path under ``streaming.checkpoint_dir``: the one place the folder's layout is written.

::

    <checkpoint_dir>/
      router.lock                      the router lock (streaming.state.lock)
      publishes/                       Spark's checkpoint of the streaming query
        offsets/<batch id>             its offset log (streaming.state.offsets_log)
        commits/<batch id>             its commit log: the batches Spark finished
      router/                          the router's own state
        router-id                      this router's identity (the Delta txnAppId stem)
        snapshot-audit-id              the id the snapshot versions' subscriptions audit is
                                       keyed by (streaming.router.subscriptions.snapshots)
        publishes-topic-id             Kafka's id of the publishes topic publishes/ reads
                                       (streaming.router.topics.incarnations)
        lineage                        the router ids this state was restored from (streaming.router.restore)
        snapshots/<version>.changes    JSON: the changelog changes that made <version>
        snapshots/<version>.meta       JSON: what is known of <version> without reading it
        snapshots/<version>.snapshot   the compiler's snapshot bytes (Snapshot.to_bytes)
        pins/<batch id>                the snapshot version micro-batch <batch id> used
        audit-journal/                 each batch's audit until Delta has it (streaming.audit.journal)
        retained/<batch id>.arrow|.done the retained messages a batch delivers to new
                                       subscriptions, and its done mark (streaming.router.retained)
        retained/applied-<version>.arrow|.done  the same for the subscriptions the idle router
                                       applied at <version>
        replays.json                   the replays in progress (subscribe --since:
                                       streaming.router.replay.replay)
        status.json                    the last batch's report (streaming.router.batch.report)
        maintenance.json               the last audit maintenance pass (streaming.audit.maintenance)
      realtime/                        streaming.mode = "realtime" (streaming.realtime)
        routing/                       Spark's checkpoint of the routing query (Real-Time Mode)
        audit/                         Spark's checkpoint of the audit query over the routed records
        audit-journal/                 the audit query's batches until Delta has them
      spark/                           the working folder of a JVM bitroute launches
      publishes.<topic id>/            Spark's checkpoint of a deleted incarnation of the
                                       publishes topic, moved aside (streaming.router.topics.incarnations)

Paths only: what is in the files belongs to the modules named above. Nothing
here touches the disk, so the operator's read-only verbs (``bitroute status``,
``explain``) use the same layout as the router.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import overload

SNAPSHOT_SUFFIX = ".snapshot"
CHANGES_SUFFIX = ".changes"
META_SUFFIX = ".meta"


class _Under:
    """A path of the layout: ``name`` under the layout's path ``parent`` (the name of
    another attribute), read like a property."""

    def __init__(self, parent: str, name: str, doc: str | None = None) -> None:
        self.parent, self.name, self.__doc__ = parent, name, doc

    @overload
    def __get__(self, layout: None, owner: type) -> _Under: ...

    @overload
    def __get__(self, layout: CheckpointLayout, owner: type | None = None) -> Path: ...

    def __get__(self, layout: CheckpointLayout | None, owner: type | None = None) -> Path | _Under:
        if layout is None:  # looked up on the class (documentation, introspection)
            return self
        parent: Path = getattr(layout, self.parent)
        return parent / self.name


@dataclass(frozen=True)
class CheckpointLayout:
    """The layout of one checkpoint folder (module docstring); ``root`` is absolute."""

    root: Path

    @classmethod
    def of(cls, checkpoint_dir: str | Path) -> CheckpointLayout:
        return cls(Path(checkpoint_dir).absolute())

    # --- the checkpoint folder --------------------------------------------------------
    lock_file = _Under("root", "router.lock")
    query = _Under("root", "publishes",
                   "Spark's checkpoint of the streaming query (its ``checkpointLocation``).")
    offsets = _Under("query", "offsets",
                     "Spark's offset log of the query (absent until its first batch).")
    commits = _Under("query", "commits")
    jvm = _Under("root", "spark",
                 "The working folder of a JVM bitroute launches (Spark's warehouse goes in it).")

    def offsets_file(self, batch_id: int) -> Path:
        return self.offsets / str(batch_id)

    @property
    def initial_offsets_file(self) -> Path:
        """The Kafka source's starting offsets, written when the query first started."""
        return self.query / "sources" / "0" / "0"

    def retired_query(self, topic_id: str) -> Path:
        """Where the query's checkpoint of the publishes topic's incarnation ``topic_id`` is
        moved once that incarnation is deleted."""
        return self.root / f"publishes.{topic_id}"

    # --- the router's state -----------------------------------------------------------
    state = _Under("root", "router")
    router_id_file = _Under("state", "router-id")
    lineage_file = _Under("state", "lineage")
    snapshot_audit_id_file = _Under("state", "snapshot-audit-id")
    publishes_topic_id_file = _Under("state", "publishes-topic-id")
    snapshots = _Under("state", "snapshots")
    pins = _Under("state", "pins")
    audit_journal = _Under("state", "audit-journal")
    retained = _Under("state", "retained")
    status_file = _Under("state", "status.json")
    maintenance_file = _Under("state", "maintenance.json")
    replays_file = _Under("state", "replays.json", "The replays in progress (``subscribe --since``, "
                          ":mod:`streaming.router.replay.replay`).")

    def snapshot_file(self, version: int) -> Path:
        return self.snapshots / f"{version}{SNAPSHOT_SUFFIX}"

    def changes_file(self, version: int) -> Path:
        return self.snapshots / f"{version}{CHANGES_SUFFIX}"

    def meta_file(self, version: int) -> Path:
        return self.snapshots / f"{version}{META_SUFFIX}"

    @staticmethod
    def snapshot_version(name: str) -> int | None:
        """The version a file name of :attr:`snapshots` is the snapshot of, else None."""
        stem = name[:-len(SNAPSHOT_SUFFIX)] if name.endswith(SNAPSHOT_SUFFIX) else ""
        return int(stem) if stem.isdigit() else None

    def pin_file(self, batch_id: int) -> Path:
        return self.pins / str(batch_id)

    # --- realtime mode ----------------------------------------------------------------
    realtime = _Under("root", "realtime", "Realtime mode's folder (:mod:`streaming.realtime`).")
    realtime_routing = _Under("realtime", "routing",
                              "Spark's checkpoint of realtime mode's routing query.")
    realtime_audit = _Under("realtime", "audit", "Spark's checkpoint of realtime mode's audit query.")
    realtime_audit_journal = _Under("realtime", "audit-journal")
