"""compiler.offline: the kernel path answers exactly as the Python reference
path does, and takes the files it should.

The command's contract (stdout, stderr, exit status) is tested through its
front end in tests/streaming/cli/test_match.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from compiler import offline
from compiler.grammar import kernel_grammar, parse_dialect
from compiler.subscription import SUBSCRIBER_RULE

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


def _paths(tmp_path: Path, dialect: str, subs: str, topics: str, monkeypatch) -> tuple:
    """``(default, reference)`` results: the first through whichever path
    takes the files (the kernel when it can), the other with the kernel
    turned off."""
    (tmp_path / "s").write_text(subs, encoding="utf-8")
    (tmp_path / "t").write_text(topics, encoding="utf-8")

    def run():
        result = offline.match_files(dialect, str(tmp_path / "s"), str(tmp_path / "t"))
        return result.rejections, "".join(result.lines())

    default = run()
    with monkeypatch.context() as patch:
        patch.setattr(offline, "offline_match", lambda *args: None)
        reference = run()
    return default, reference


@pytest.mark.parametrize("dialect, filters, "
                         "topics", [("amqp", amqp_filters, amqp_topics), ("mqtt", mqtt_filters, mqtt_topics)])
def test_default_path_equals_reference_path(dialect, filters, topics, tmp_path, monkeypatch):
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
        default, reference = _paths(tmp_path, dialect, _lines(subs), _lines(topic_records), monkeypatch)
        assert default == reference

    check()


def test_null_and_invalid_topics(tmp_path, monkeypatch):
    subs = _lines(
        [{"id": "s1", "filter": "a/+"}, {"id": "s2", "filter": "$share/g/a/b"}, {"id": "s3", "filter": "$share/g/a/b"}]
    )
    topics = '{"topic": "a/b"}\n{"topic": null}\n{"other": 1}\n{"topic": "a/+"}\n{"topic": "a/b"}\n'
    default, reference = _paths(tmp_path, "mqtt", subs, topics, monkeypatch)
    assert default == reference
    lines = [json.loads(x) for x in reference[1].splitlines()]
    assert lines[0]["subscriptions"][0] == "s1" and len(lines[0]["subscriptions"]) == 2
    assert "error" in lines[1] and "error" in lines[2] and "wildcards" in lines[3]["error"]


def _kernel_takes(dialect: str, subs: bytes, topics: bytes) -> bool:
    return offline.offline_match(subs, topics, kernel_grammar(parse_dialect(dialect)), SUBSCRIBER_RULE) is not None


def test_the_kernel_takes_clean_files_and_leaves_those_needing_a_message():
    clean_subs = b'{"id": "a", "filter": "x.*"}\n  {"id": 7, "filter": "#", "subscriber": null, "headers": null}\n\t\n'
    clean_topics = b'{"topic": "x.y", "message_id": "m"}\n{"topic": "", "headers": null, "other": [1]}'
    assert _kernel_takes("amqp", clean_subs, clean_topics)
    assert _kernel_takes("mqtt", b"", b"")
    for subs in (
        b'{"id": "a", "filter": "x", "subscriber": "bad name"}\n',  # a rejection to report
        b'{"id": "a", "filter": "x"}\n{"id": "a", "filter": "y"}\n',  # a duplicate id
        b'{"id": "", "filter": "x"}\n',
        b'{"id": null, "filter": "x"}\n',
        b'{"filter": "x"}\n',
        b'{"id": 1.5, "filter": "x"}\n',
        b'{"id": true, "filter": "x"}\n',
        b'{"id": "a", "filter": null}\n',
        b'{"id": "a", "filter": "x", "headers": {"match": "all", "criteria": {}}}\n',
        b'{"id": "a", "filter": "x"}\r\n',  # a line break Python reads otherwise
        b'["a", "x"]\n',  # not an object: the Python path raises InputFileError
        b'{"id": "\\udc80", "filter": "x"}\n',  # a lone surrogate
        b"\xff\n",
    ):
        assert not _kernel_takes("amqp", subs, clean_topics), subs
    for filter_text in ("$share/g/a", "a/#/b", "a+", ""):
        assert not _kernel_takes("mqtt", json.dumps({"id": "a", "filter": filter_text}).encode(), b""), filter_text
    for topics in (
        b'{"other": 1}\n',
        b'{"topic": null}\n',
        b'{"topic": 3}\n',
        b'{"topic": "x", "message_id": null}\n',
        b'{"topic": "x", "headers": {"h": "1"}}\n',
        b'{"topic": "' + b"a" * 256 + b'"}\n',
    ):
        assert not _kernel_takes("amqp", clean_subs, topics), topics
    assert not _kernel_takes("mqtt", b"", b'{"topic": "a/+"}\n')


def test_the_kernel_writes_what_the_reference_path_writes(tmp_path, monkeypatch):
    subs = (
        "".join(
            json.dumps(r) + "\n"
            for r in [
                {"id": 'é"\\\u0001😀', "filter": "#"},
                {"id": -0, "filter": "a.*"},
                {"id": 2**62, "filter": "a.b"},
                {"id": -5, "filter": "#.b"},
                {"id": "s", "filter": "a.b", "subscriber": "c1"},
                {"id": "t", "filter": "a.b"},
            ]
        )
        + "   \n\t\n"
        + '  {"id": "indented", "filter": "*.*"}'
    )
    topics = "".join(
        json.dumps(r) + "\n"
        for r in [
            {"topic": "a.b"},
            {"topic": 'ü."\u007f'},
            {"topic": ""},
            {"topic": "a..b", "message_id": "x"},
            {"topic": "😀.b"},
        ]
    )
    assert _kernel_takes("amqp", subs.encode(), topics.encode())
    default, reference = _paths(tmp_path, "amqp", subs, topics, monkeypatch)
    assert default == reference
    assert json.loads(default[1].splitlines()[0])["subscriptions"] == [
        -5,
        0,
        2**62,
        "indented",
        "s",
        "t",
        'é"\\\u0001😀',
    ]


@pytest.mark.parametrize(
    "dialect, filters, topics", [("amqp", amqp_filters, amqp_topics), ("mqtt", mqtt_filters, mqtt_topics)]
)
def test_kernel_path_equals_reference_path_on_files_it_takes(dialect, filters, topics, tmp_path, monkeypatch):
    # Any text but lone surrogates and the line breaks of str.splitlines, written raw (ensure_ascii=False).
    characters = st.characters(exclude_categories=["Cs"], exclude_characters="\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
    valid_ids = st.one_of(st.integers(-(2**70), 2**70), st.text(characters, min_size=1, max_size=4))
    plain_filters = filters.filter(
        lambda f: (
            not f.startswith("$share/")
            and "a+" not in f
            and f.count("#") <= 1
            and (dialect == "amqp" or (f and (f.endswith("#") or "#" not in f)))
        )
    )

    @SETTINGS
    @given(
        st.lists(
            st.builds(lambda i, f: {"id": i, "filter": f}, valid_ids, plain_filters),
            max_size=20,
            unique_by=lambda r: json.dumps(r["id"]),
        ),
        st.lists(topics.filter(lambda t: dialect == "amqp" or (t and "+" not in t)), max_size=20),
    )
    def check(subs, topic_list):
        subs_text, topics_text = _lines(subs), _lines({"topic": t} for t in topic_list)
        assert _kernel_takes(dialect, subs_text.encode(), topics_text.encode())
        default, reference = _paths(tmp_path, dialect, subs_text, topics_text, monkeypatch)
        assert default == reference

    check()


def test_the_kernel_applies_the_grammar_rules_it_is_handed():
    mqtt = kernel_grammar(parse_dialect("mqtt"))
    shared = b'{"id": "a", "filter": "$share/g/x"}\n'
    assert offline.offline_match(shared, b"", mqtt, SUBSCRIBER_RULE) is None  # a shared group: the Python path
    assert offline.offline_match(shared, b"", mqtt._replace(share_prefix="$other/"), SUBSCRIBER_RULE) is not None
    named = b'{"id": "a", "filter": "x", "subscriber": "c1"}\n'
    assert offline.offline_match(named, b"", mqtt, SUBSCRIBER_RULE) is not None
    assert offline.offline_match(named, b"", mqtt, SUBSCRIBER_RULE._replace(characters="abc1")) is not None
    assert offline.offline_match(named, b"", mqtt, SUBSCRIBER_RULE._replace(characters="abc")) is None
    assert offline.offline_match(named, b"", mqtt, SUBSCRIBER_RULE._replace(max_chars=1)) is None
    assert offline.offline_match(named, b"", mqtt, SUBSCRIBER_RULE._replace(reserved=("c1",))) is None


def test_equal_numeric_ids_keep_the_order_of_their_deliveries(tmp_path):
    # Ties of _id_order (1 and 1.0, -0.0 and 0) stay in delivery order (subscriber, then id);
    # a repeated topic answers the same, a bad header or message id is that line's error.
    subs = _lines(
        [
            {"id": 1.0, "filter": "#", "subscriber": "b"},
            {"id": 1, "filter": "#", "subscriber": "a"},
            {"id": 0, "filter": "#", "subscriber": "c"},
            {"id": -0.0, "filter": "#", "subscriber": "a"},
            {"id": "x", "filter": "#"},
            {"id": 2, "filter": "#", "subscriber": "a"},
            {"id": 2.0, "filter": "q", "subscriber": "a"},
        ]
    )
    topics = _lines(
        [
            {"topic": "q"},
            {"topic": "a.b"},
            {"topic": "q", "headers": 3},
            {"topic": "q", "message_id": 7},
            {"topic": "q"},
        ]
    )
    (tmp_path / "s").write_text(subs)
    (tmp_path / "t").write_text(topics)
    result = offline.match_files("amqp", str(tmp_path / "s"), str(tmp_path / "t"))
    assert "".join(result.lines()).splitlines() == [
        '{"topic": "q", "subscriptions": [-0.0, 0, 1, 1.0, 2, 2.0, "x"]}',
        '{"topic": "a.b", "subscriptions": [-0.0, 0, 1, 1.0, 2, "x"]}',
        '{"topic": "q", "error": "headers must be an object of string or null values, not 3"}',
        '{"topic": "q", "error": "message_id must be a string, not 7"}',
        '{"topic": "q", "subscriptions": [-0.0, 0, 1, 1.0, 2, 2.0, "x"]}',
    ]
