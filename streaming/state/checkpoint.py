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

SNAPSHOT_SUFFIX = ".snapshot"
CHANGES_SUFFIX = ".changes"
META_SUFFIX = ".meta"


@dataclass(frozen=True)
class CheckpointLayout:
    """The layout of one checkpoint folder (module docstring); ``root`` is absolute."""

    root: Path

    @classmethod
    def of(cls, checkpoint_dir: str | Path) -> CheckpointLayout:
        return cls(Path(checkpoint_dir).absolute())

    # --- the checkpoint folder --------------------------------------------------------
    @property
    def lock_file(self) -> Path:
        return self.root / "router.lock"

    @property
    def query(self) -> Path:
        """Spark's checkpoint of the streaming query (its ``checkpointLocation``)."""
        return self.root / "publishes"

    @property
    def offsets(self) -> Path:
        """Spark's offset log of the query (absent until its first batch)."""
        return self.query / "offsets"

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

    @property
    def commits(self) -> Path:
        return self.query / "commits"

    @property
    def jvm(self) -> Path:
        """The working folder of a JVM bitroute launches (Spark's warehouse goes in it)."""
        return self.root / "spark"

    # --- the router's state -----------------------------------------------------------
    @property
    def state(self) -> Path:
        return self.root / "router"

    @property
    def router_id_file(self) -> Path:
        return self.state / "router-id"

    @property
    def lineage_file(self) -> Path:
        return self.state / "lineage"

    @property
    def snapshot_audit_id_file(self) -> Path:
        return self.state / "snapshot-audit-id"

    @property
    def publishes_topic_id_file(self) -> Path:
        return self.state / "publishes-topic-id"

    @property
    def snapshots(self) -> Path:
        return self.state / "snapshots"

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

    @property
    def pins(self) -> Path:
        return self.state / "pins"

    def pin_file(self, batch_id: int) -> Path:
        return self.pins / str(batch_id)

    @property
    def audit_journal(self) -> Path:
        return self.state / "audit-journal"

    @property
    def retained(self) -> Path:
        return self.state / "retained"

    @property
    def status_file(self) -> Path:
        return self.state / "status.json"

    @property
    def maintenance_file(self) -> Path:
        return self.state / "maintenance.json"

    @property
    def realtime(self) -> Path:
        """Realtime mode's folder (:mod:`streaming.realtime`)."""
        return self.root / "realtime"

    @property
    def realtime_routing(self) -> Path:
        """Spark's checkpoint of realtime mode's routing query."""
        return self.realtime / "routing"

    @property
    def realtime_audit(self) -> Path:
        """Spark's checkpoint of realtime mode's audit query."""
        return self.realtime / "audit"

    @property
    def realtime_audit_journal(self) -> Path:
        return self.realtime / "audit-journal"

    @property
    def replays_file(self) -> Path:
        """The replays in progress (``subscribe --since``, :mod:`streaming.router.replay.replay`)."""
        return self.state / "replays.json"
