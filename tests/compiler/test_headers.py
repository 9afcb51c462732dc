"""Header criteria: all / any / presence, decoding, and bulk evaluation in the matcher."""

from __future__ import annotations

import pytest

from compiler import HeaderCriteria, HeaderCriteriaError, HeaderError, Subscription


@pytest.mark.parametrize(
    "criteria, headers, expected",
    [
        (HeaderCriteria("all", {"a": "1", "b": None}), {"a": "1", "b": "x"}, True),
        (HeaderCriteria("all", {"a": "1", "b": None}), {"a": "1"}, False),
        (HeaderCriteria("all", {"a": "1", "b": None}), {"a": "2", "b": "x"}, False),
        (HeaderCriteria("all", {"a": "1"}), {"a": b"1"}, True),
        (HeaderCriteria("all", {"a": "é"}), {"a": "é".encode()}, True),
        (HeaderCriteria("all", {"a": "1"}), {"a": b"\xff"}, False),
        (HeaderCriteria("all", {"a": None}), {"a": b"\xff"}, True),
        (HeaderCriteria("all", {"a": None}), {"a": None}, True),
        (HeaderCriteria("all", {"a": "1"}), {"a": None}, False),
        (HeaderCriteria("any", {"a": "1", "b": None}), {"b": "x"}, True),
        (HeaderCriteria("any", {"a": "1", "b": None}), {"a": "1"}, True),
        (HeaderCriteria("any", {"a": "1", "b": None}), {"a": "2", "c": "x"}, False),
        (HeaderCriteria("all", {}), {}, True),
        (HeaderCriteria("any", {}), {"a": "1"}, False),
    ],
)
def test_matches(criteria, headers, expected):
    assert criteria.matches(headers) is expected


@pytest.mark.parametrize(
    "obj, message",
    [
        ("all", "must be an object"),
        ({"match": "all"}, "missing criteria"),
        ({"criteria": {}}, "missing match"),
        ({"match": "some", "criteria": {}}, "'all' or 'any'"),
        ({"match": "all", "criteria": []}, "must be an object"),
        ({"match": "all", "criteria": {"a": 1}}, "string value or null"),
        ({"match": "all", "criteria": {"": "x"}}, "non-empty UTF-8 string"),
        ({"match": "all", "criteria": {"a": "\udc80"}}, "UTF-8 string value"),
        ({"match": "all", "criteria": {}, "extra": 1}, "unknown fields extra"),
    ],
)
def test_from_json_rejects_malformed_criteria(obj, message):
    with pytest.raises(HeaderCriteriaError, match=message):
        HeaderCriteria.from_json(obj)


def test_from_json_round_trip_and_immutability():
    criteria = HeaderCriteria.from_json({"match": "any", "criteria": {"a": "1", "b": None}})
    assert criteria == HeaderCriteria("any", {"b": None, "a": "1"})
    assert hash(criteria) == hash(HeaderCriteria("any", {"b": None, "a": "1"}))
    assert HeaderCriteria.from_json(criteria.to_json()) == criteria
    with pytest.raises(TypeError):
        criteria.criteria["c"] = "x"


def _subs():
    return [
        Subscription("all-ab", "amq", "alice", "#", HeaderCriteria("all", {"a": "1", "b": None})),
        Subscription("any-ab", "amq", "bob", "#", HeaderCriteria("any", {"a": "1", "b": None})),
        Subscription("all-a2", "amq", "carol", "x.*", HeaderCriteria("all", {"a": "2"})),
        Subscription("all-none", "amq", "dave", "x.y", HeaderCriteria("all", {})),
        Subscription("any-none", "amq", "erin", "x.y", HeaderCriteria("any", {})),
        Subscription("plain", "amq", "frank", "x.y"),
        Subscription("all-abc", "amq", "gina", "#", HeaderCriteria("all", {"a": "1", "b": "2", "c": None})),
    ]


@pytest.mark.parametrize(
    "headers, expected",
    [
        (None, ["all-none", "plain"]),
        ({"a": "1"}, ["all-none", "any-ab", "plain"]),
        ({"a": "1", "b": "z"}, ["all-ab", "all-none", "any-ab", "plain"]),
        ({"a": "2"}, ["all-a2", "all-none", "plain"]),
        ({"b": b"\xff", "unrelated": "x"}, ["all-none", "any-ab", "plain"]),
        ({"a": b"1", "b": b"2", "c": None}, ["all-ab", "all-abc", "all-none", "any-ab", "plain"]),
    ],
)
def test_topic_filter_and_criteria_combine_by_and(routing, headers, expected):
    r = routing(_subs())
    assert r.ids("amq", "x.y", headers) == expected


def test_criteria_only_apply_where_the_filter_matches(routing):
    assert routing(_subs()).ids("amq", "q", {"a": "1", "b": "2", "c": "3"}) == ["all-ab", "all-abc", "any-ab"]


def test_match_rejects_malformed_headers(routing):
    r = routing(_subs())
    with pytest.raises(HeaderError, match="mapping"):
        r.matcher.match("amq", "x.y", [("a", "1")])
    with pytest.raises(HeaderError, match="name must be a string"):
        r.matcher.match("amq", "x.y", {1: "1"})
    with pytest.raises(HeaderError, match="bytes, str or null"):
        r.matcher.match("amq", "x.y", {"a": 1})


def test_batch_headers_entries_and_repeated_names(routing):
    """Headers in the router's batch path (``Matcher.match_columns``): per row ``None`` or
    Kafka header entries, pairs or ``{"key", "value"}`` mappings."""
    r = routing(_subs())
    headers = [
        [("a", b"1"), ("b", None)],
        [{"key": "a", "value": b"2"}, {"key": "a", "value": b"1"}, {"key": "b", "value": b"x"}],
        [("a", b"\xff")],
        None,
        [("a",)],
    ]
    deliveries, errors = r.matcher.match_columns([f"m{i}" for i in range(5)], ["amq"] * 5,
                                                 [b"x.y"] * 5, headers)
    ids = [sorted(i for d in row for i in d["subscription_ids"]) for row in deliveries.to_pylist()]
    assert ids[0] == ["all-ab", "all-none", "any-ab", "plain"]
    # Of a repeated name, the last entry counts (Kafka's lastHeader).
    assert ids[1] == ["all-ab", "all-none", "any-ab", "plain"]
    assert ids[2] == ["all-none", "plain"]
    assert ids[3] == ["all-none", "plain"]
    assert ids[4] == [] and "header entry" in errors[4]
    assert errors[:4].tolist() == [None] * 4
