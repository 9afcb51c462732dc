"""Spark's offset log read back (streaming.state.offsets_log): the files as Spark's
OffsetSeqLog writes them, version 1 and version 2, no Spark needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streaming.state.checkpoint import CheckpointLayout
from streaming.state.offsets_log import (
    OffsetLogError,
    batch_records,
    last_committed_batch,
    read_offsets,
)

METADATA = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1735787045000, "conf": {}})


def _entry(layout: CheckpointLayout, batch_id: int, *sources: str, version: str = "v1") -> Path:
    """An offset log entry as Spark writes it: lines joined by newlines, none at the end."""
    path = layout.offsets_file(batch_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([version, METADATA, *sources]))
    return path


def test_every_source_line_after_the_metadata_is_read(tmp_path: Path):
    layout = CheckpointLayout.of(tmp_path)
    one = _entry(layout, 1, json.dumps({"pubs": {"0": 5, "1": 7}}))
    assert read_offsets(one) == {"pubs": {0: 5, 1: 7}}
    # Several sources, one without offsets in this batch ("-"): neither the third
    # line alone nor the last line alone would do.
    several = _entry(layout, 2, json.dumps({"pubs": {"0": 6}}), "-", json.dumps({"other": {"0": 1}}))
    assert read_offsets(several) == {"pubs": {0: 6}, "other": {0: 1}}
    assert read_offsets(_entry(layout, 3, "-")) == {}
    # Version 2 (Spark 4.1's OffsetMap): "<source id>:<offset>" lines.
    v2 = _entry(layout, 4, "0:" + json.dumps({"pubs": {"0": 9}}), "1:-", version="v2")
    assert read_offsets(v2) == {"pubs": {0: 9}}


def test_a_file_that_is_not_an_offset_log_entry_is_named_in_the_error(tmp_path: Path):
    layout = CheckpointLayout.of(tmp_path)
    for bad in (_entry(layout, 1, "{not json"), _entry(layout, 2, "[1, 2]", version="v1")):
        with pytest.raises(OffsetLogError, match=str(bad)):
            read_offsets(bad)
    wrong = layout.offsets_file(3)
    wrong.write_text("hello\nworld")
    with pytest.raises(OffsetLogError, match="not a Spark offset log entry"):
        read_offsets(wrong)


def test_a_batch_holds_the_records_between_its_end_offsets_and_the_previous_batch(tmp_path: Path):
    layout = CheckpointLayout.of(tmp_path)
    _entry(layout, 4, json.dumps({"pubs": {"0": 5}}))
    _entry(layout, 5, json.dumps({"pubs": {"0": 8, "1": 2}}))
    assert batch_records(layout, 5, "pubs") == 3 + 2  # partition 1 is new: from 0
    assert batch_records(layout, 0, "pubs") is None  # the first batch: unknown
    assert batch_records(layout, 6, "pubs") is None  # no entry for batch 6
    assert batch_records(layout, 5, "elsewhere") is None
    _entry(layout, 7, "{torn")
    _entry(layout, 8, json.dumps({"pubs": {"0": 9}}))
    assert batch_records(layout, 8, "pubs") is None  # an unreadable entry: distributed


def test_the_last_committed_batch_is_the_highest_commit(tmp_path: Path):
    layout = CheckpointLayout.of(tmp_path)
    assert last_committed_batch(layout) is None
    layout.commits.mkdir(parents=True)
    assert last_committed_batch(layout) is None
    for batch in (3, 12, 9):
        (layout.commits / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    (layout.commits / ".12.crc").write_text("")
    assert last_committed_batch(layout) == 12
