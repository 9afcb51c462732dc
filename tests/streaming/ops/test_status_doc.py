"""docs/operations.md's `bitroute status` section against the code, without a broker.

The JSON keys the page lists are the keys :func:`streaming.ops.status.router_status`
returns (asked of an unreachable Kafka and empty folders, which it answers within its
Kafka budget); the page's sample is what :func:`streaming.cli.render.status_lines`
prints, line names in order; every line the renderer can print is in the page's table.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from streaming.cli.render import status_lines
from streaming.config import load
from streaming.kafka.broker import free_port
from streaming.ops.status import router_status

OPERATIONS_DOC = Path(__file__).resolve().parents[3] / "docs" / "operations.md"
NOW = datetime(2025, 1, 2, 3, 4, 9, tzinfo=UTC)


def _section() -> str:
    text = OPERATIONS_DOC.read_text()
    return text.split("\n## Is the router running? `bitroute status`\n", 1)[1].split("\n## ", 1)[0]


def _documented_json_keys() -> list[str]:
    """The backticked names outside parentheses in the paragraph "The JSON object has the keys"."""
    section = _section() + "\n\n"
    found = re.search(r"The JSON\s+object has the keys", section)
    assert found is not None, "the paragraph of the JSON keys"
    start = found.start()
    paragraph = section[start:section.index("\n\n", start)]
    keys, depth, in_code, token = [], 0, False, ""
    for char in paragraph:
        if in_code:
            if char == "`":
                in_code = False
                if depth == 0:
                    keys.append(token)
            else:
                token += char
        elif char == "`":
            in_code, token = True, ""
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
    return keys


def _sample_lines() -> list[tuple[str, str]]:
    """The sample output block: (line name, value) per line."""
    [block] = re.findall(r"\n```\n(router: .*?)\n```\n", _section(), re.S)
    return [(name, value.strip()) for name, value in
            (line.split(":", 1) for line in block.splitlines())]


def _table_names() -> set[str]:
    """The line names of the table's first column ("query, last batch" names two)."""
    names = set()
    for row in re.findall(r"^\| (.+?) \|", _section(), re.M):
        if row in ("line", "---"):
            continue
        if row.startswith("table "):
            names |= {f"table {t.strip()}" for t in row[len("table "):].split(",")}
        else:
            names |= {n.strip() for n in row.split(",")}
    return names


def test_the_documented_json_keys_are_the_keys_router_status_returns(tmp_path: Path):
    config = load(overrides={
        "kafka.bootstrap": f"127.0.0.1:{free_port()}",
        "broker.embedded": "false",
        "delta.warehouse": str(tmp_path / "delta"),
        "streaming.checkpoint_dir": str(tmp_path / "checkpoints"),
    }, environ={})
    started = time.monotonic()
    status = router_status(config)
    assert time.monotonic() - started < 10.0  # its budget is 2 s; a loaded machine gets slack
    assert status["kafka_error"] is not None and status["running"] is False
    documented = _documented_json_keys()
    assert len(documented) == len(set(documented)), documented
    assert sorted(documented) == sorted(status)


def _full_status() -> dict:
    """A status with every line the renderer prints, the sample's figures where it has them."""
    return {
        "mode": "microbatch", "running": True, "stopping": False,
        "router": {"pid": 41872, "host": "node-3", "started_at": "2025-01-02T03:00:00+00:00",
                   "jvm_pid": 41903},
        "last_batch": {
            "query_id": "5b1e4c1e-...", "run_id": "9f2d-...", "batch_id": 7, "publishes": 120,
            "deliveries": 930, "rejected": 2, "lost": 0, "snapshot_version": 3, "seconds": 1.25,
            "stages": {"catch_up": 0.01, "route": 0.84, "audit": 0.40}, "routed_in": "executors",
            "finished_at": "2025-01-02T03:04:05+00:00", "subscriptions": 3,
            "audit_pending_batches": 1, "audit_lag_seconds": 2.5, "lost_total": 40,
            "expired_total": 3,
            "mode": "microbatch", "latency_ms": {"p50": 310.0, "p99": 1240.0, "max": 1710.0},
            "realtime": {"view_version": 3, "audited_publishes": 5000}},
        "committed_batch": 7,
        "input_lag": {"topic": "bitroute.publishes", "records": 6, "partitions": {"0": 6}},
        "changelog_lag": {"topic": "bitroute.subscriptions", "records": 1,
                          "partitions": {"0": 1}},
        "retention_gap": {"topic": "bitroute.publishes", "records": 40, "partitions": {"0": 40}},
        "snapshot_version": 3, "subscriptions": 3, "subscribers": 2,
        "limits": {"amq.topic": {"max_subscriptions_per_subscriber": {"limit": 10_000, "used": 2},
                                 "max_filter_levels": {"limit": 128, "used": 3}}},
        "unfed_delivery_topics": ["bitroute.deliveries.old"],
        "alternate_exchanges": {"amq.topic": "amq.unrouted"},
        "kafka_error": "Kafka at node-1:9092 did not answer",
        "audit_tables": {"deliveries": {"files": 12, "bytes": 1_900_000, "log_entries": 14,
                                        "version": 240},
                         "messages": {"error": "no table yet"},
                         "subscriptions": {"files": 2, "bytes": 9_000, "log_entries": 3,
                                           "version": 5}},
        "maintenance": {"finished_at": "2025-01-02T02:30:00+00:00", "ok": True, "seconds": 3.0,
                        "tables": []},
        "lease": {"router_id": "3f9c", "host": "node-3", "checkpoint_dir": "/c", "epoch": 4,
                  "age_seconds": 2.0},
        "replays": [{"subscription": "s9", "subscriber": "audit", "from": "2025-01-02T02:00:00Z",
                     "to_batch": 6, "publishes": 100, "done": 50, "delivered": 50,
                     "rate": 900.0, "note": None}],
        "notes": ["a note"],
    }


def test_every_status_line_is_in_the_table():
    # One `limits <exchange>` line per exchange: the table's row is named so.
    names = [re.sub(r"^limits .*", "limits <exchange>", line.split(":", 1)[0])
             for line in status_lines(_full_status(), NOW)]
    missing = sorted(set(names) - _table_names())
    assert not missing, f"docs/operations.md's status table lacks the lines {missing}"


def test_the_sample_is_what_the_renderer_prints():
    sample = _sample_lines()
    status = _full_status()
    for key in ("retention_gap", "unfed_delivery_topics", "kafka_error", "alternate_exchanges"):
        status[key] = None
    status["replays"], status["notes"], status["limits"] = [], [], None
    del status["last_batch"]["realtime"]
    status["last_batch"]["lost_total"] = status["last_batch"]["expired_total"] = 0
    rendered = status_lines(status, NOW)
    assert [name for name, _ in sample] == [line.split(":", 1)[0] for line in rendered]
    # The lines whose figures the sample and the status above share, word for word.
    expected = dict((line.split(":", 1)[0], line.split(":", 1)[1].strip()) for line in rendered)
    for name in ("router", "mode", "query", "last batch", "input lag", "changelog lag",
                 "subscriptions", "audit"):
        assert dict(sample)[name] == expected[name], name


def test_the_documented_last_batch_keys_are_what_the_router_writes(tmp_path: Path):
    """The keys the page gives `last_batch` (status.json as written) against StatusFile's."""
    import dataclasses
    import json

    from streaming.router.batch.report import BatchReport, StatusFile

    section = " ".join(_section().split())
    listed = re.search(r"`last_batch` \(the router's `status.json` as written: (.*?)\), "
                       r"`committed_batch`", section)
    assert listed is not None
    documented = re.findall(r"`([a-z_]+)`", listed.group(1))
    status_file = StatusFile(tmp_path / "status.json", lambda: {"realtime": {}})
    required: dict[str, Any] = {f.name: 0 for f in dataclasses.fields(BatchReport)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    status_file(BatchReport(**required))
    written = json.loads((tmp_path / "status.json").read_text())
    assert sorted(documented) == sorted(written)
