"""compiler.offline: the columnar path answers exactly as the record path does.

The command's contract (stdout, stderr, exit status) is tested through its
front end in tests/streaming/test_match_cli.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler import offline

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

amqp_filters = st.lists(st.sampled_from(["a", "b", "", "*", "#", "a*"]), max_size=6).map(".".join)
amqp_topics = st.lists(st.sampled_from(["a", "b", "", "#", "é"]), max_size=6).map(".".join)
mqtt_filters = st.builds(
    lambda share, levels, tail: share + "/".join(levels + (["#"] if tail else [])),
    st.sampled_from(["", "", "", "$share/g/"]),
    st.lists(st.sampled_from(["a", "b", "", "+", "$x", "a+"]), min_size=1, max_size=4),
    st.booleans(),
)
mqtt_topics = st.lists(st.sampled_from(["a", "b", "", "$x", "+", 'q"'], ), min_size=1, max_size=5).map("/".join)
string_ids = st.sampled_from(["s1", "s2", "x y", "", ".", "ü", 'q"', "s3"])
int_ids = st.integers(-3, 40)
subscribers = st.none() | st.sampled_from(["c0", "c1", "bad name", ""])


def _lines(records) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def _both(tmp_path: Path, dialect: str, subs: str, topics: str, monkeypatch) -> tuple:
    (tmp_path / "s").write_text(subs, encoding="utf-8")
    (tmp_path / "t").write_text(topics, encoding="utf-8")
    result = offline.match_files(dialect, str(tmp_path / "s"), str(tmp_path / "t"))
    columnar = (result.rejections, "".join(result.lines()))
    with monkeypatch.context() as patch:
        patch.setattr(offline, "_columnar_table", lambda data, ok: None)
        result = offline.match_files(dialect, str(tmp_path / "s"), str(tmp_path / "t"))
        records = (result.rejections, "".join(result.lines()))
    return columnar, records


@pytest.mark.parametrize("dialect, filters, topics", [("amqp", amqp_filters, amqp_topics), ("mqtt", mqtt_filters, mqtt_topics)])
def test_columnar_path_equals_record_path(dialect, filters, topics, tmp_path, monkeypatch):
    @SETTINGS
    @given(
        st.one_of(string_ids, int_ids).flatmap(
            lambda kind: st.lists(
                st.builds(lambda i, f, s: {"id": i, "filter": f} | ({} if s is None else {"subscriber": s}),
                          string_ids if isinstance(kind, str) else int_ids, filters, subscribers),
                max_size=20,
            )
        ),
        st.lists(st.builds(lambda t, m: {"topic": t} | ({"message_id": m} if m else {}),
                           topics, st.sampled_from(["", "m1", "m2"])), max_size=20),
    )
    def check(subs, topic_records):
        columnar, records = _both(tmp_path, dialect, _lines(subs), _lines(topic_records), monkeypatch)
        assert columnar == records

    check()


def test_clean_files_take_the_columnar_path_and_odd_ones_do_not():
    ok = offline._subscription_columns_ok
    assert offline._columnar_table(b'{"id": "a", "filter": "x"}\n{"id": "b", "filter": "y"}', ok) is not None
    assert offline._columnar_table(b'{"id": 1, "filter": "x"}\n', ok) is not None
    for odd in (
        b'{"id": 1, "filter": "x"}\n{"id": "b", "filter": "y"}\n',  # mixed id types
        b'{"id": "a", "filter": "x"}\n\n{"id": "b", "filter": "y"}\n',  # blank line: line numbers
        b'{"id": "a", "filter": "x"}{"id": "b", "filter": "y"}\n',  # two objects on a line
        b'{"id": "\\udc80", "filter": "x"}\n',  # an escape Arrow reads differently
        b'{"id": null, "filter": "x"}\n',  # null and missing differ
        b'{"id": 1.5, "filter": "x"}\n',
        b'{"id": "a", "filter": "x", "headers": {"match": "all", "criteria": {}}}\n',
    ):
        assert offline._columnar_table(odd, ok) is None, odd


def test_null_and_invalid_topics_on_the_columnar_path(tmp_path, monkeypatch):
    subs = _lines([{"id": "s1", "filter": "a/+"}, {"id": "s2", "filter": "$share/g/a/b"}, {"id": "s3", "filter": "$share/g/a/b"}])
    topics = '{"topic": "a/b"}\n{"topic": null}\n{"other": 1}\n{"topic": "a/+"}\n{"topic": "a/b"}\n'
    columnar, records = _both(tmp_path, "mqtt", subs, topics, monkeypatch)
    assert columnar == records
    lines = [json.loads(x) for x in columnar[1].splitlines()]
    assert lines[0]["subscriptions"][0] == "s1" and len(lines[0]["subscriptions"]) == 2
    assert "error" in lines[1] and "error" in lines[2] and "wildcards" in lines[3]["error"]
