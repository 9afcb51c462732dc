"""streaming.atomic: the one way a local file is replaced, whole or not at all."""

from __future__ import annotations

import pytest

from streaming.atomic import write_atomically


def test_bytes_text_and_a_writer_replace_the_file_and_leave_no_temporary(tmp_path):
    path = tmp_path / "state.json"
    write_atomically(path, b"one")
    assert path.read_bytes() == b"one"
    write_atomically(path, "twó\n")
    assert path.read_text(encoding="utf-8") == "twó\n"
    write_atomically(path, lambda handle: handle.write(b"three"), durable=False)
    assert path.read_bytes() == b"three"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_a_failing_write_keeps_the_old_content_and_removes_its_temporary(tmp_path):
    path = tmp_path / "state.json"
    write_atomically(path, b"old")

    def half(handle):
        handle.write(b"ne")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, half)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
