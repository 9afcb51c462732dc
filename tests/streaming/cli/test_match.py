"""The ``bitroute match`` contract (issue 3, item 6) through ``streaming.cli.match.run_match``."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from streaming.cli.match import run_match


def _write(path: Path, lines: list) -> str:
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return str(path)


def _run(tmp_path: Path, dialect: str, subs: list, topics: list) -> tuple[int, list, list]:
    out, err = io.StringIO(), io.StringIO()
    code = run_match(
        dialect, _write(tmp_path / "subs.jsonl", subs), _write(tmp_path / "topics.jsonl", topics), out, err
    )
    return (
        code,
        [json.loads(x) for x in out.getvalue().splitlines()],
        [json.loads(x) for x in err.getvalue().splitlines()],
    )


def test_amqp_contract(tmp_path):
    subs = [
        {"id": "b", "filter": "a.*"},
        {"id": 10, "filter": "#"},
        {"id": 2, "filter": "a.b", "subscriber": "alice"},
        {"id": "a", "filter": "a.b", "subscriber": "alice"},
        {"id": 1.5, "filter": "#.b"},
        {"id": "h", "filter": "#", "headers": {"match": "all", "criteria": {"k": "v"}}},
    ]
    topics = [{"topic": "a.b"}, "", {"topic": "x"}, {"topic": "a.b", "headers": {"k": "v"}}, {"topic": "a" * 256}]
    code, out, err = _run(tmp_path, "amqp", subs, topics)
    assert code == 0 and err == []
    assert out[0] == {"topic": "a.b", "subscriptions": [1.5, 2, 10, "a", "b"]}
    assert out[1] == {"topic": "x", "subscriptions": [10]}
    assert out[2] == {"topic": "a.b", "subscriptions": [1.5, 2, 10, "a", "b", "h"]}
    assert out[3]["topic"] == "a" * 256 and "longer than 255" in out[3]["error"]
    assert len(out) == 4


def test_mqtt_contract_with_rejections(tmp_path):
    subs = [
        {"id": "ok", "filter": "sport/#"},
        {"id": "bad", "filter": "sport/#/x"},
        {"filter": "a"},
        {"id": True, "filter": "a"},
        {"id": "nofilter"},
        {"id": "badsub", "filter": "a", "subscriber": "a b"},
        {"id": "badhdr", "filter": "a", "headers": {"match": "most", "criteria": {}}},
        {"id": "ok", "filter": "dup"},
        {"id": "weird id/with spaces", "filter": "sport"},
    ]
    code, out, err = _run(tmp_path, "mqtt", subs, [{"topic": "sport"}, {"topic": "sport/+"}, {"topic": 5}])
    assert code == 0
    assert out == [
        {"topic": "sport", "subscriptions": ["ok", "weird id/with spaces"]},
        {"topic": "sport/+", "error": out[1]["error"]},
        {"topic": 5, "error": out[2]["error"]},
    ]
    assert "wildcards" in out[1]["error"] and "must be a string" in out[2]["error"]
    rejected = {json.dumps(r["id"]): r["error"] for r in err}
    assert list(rejected) == ['"bad"', "null", "true", '"nofilter"', '"badsub"', '"badhdr"', '"ok"']
    assert "'#' must be the last level: 'sport/#/x'" in rejected['"bad"']
    assert "missing field 'id'" in rejected["null"]
    assert "duplicate subscription id" in rejected['"ok"']
    assert "subscriber name" in rejected['"badsub"']


def test_shared_subscriptions_use_the_message_id(tmp_path):
    subs = [{"id": f"w{i}", "filter": "$share/g/jobs"} for i in range(4)]
    topics = [{"topic": "jobs", "message_id": f"m{n}"} for n in range(40)] + [{"topic": "jobs"}]
    code, out, _ = _run(tmp_path, "mqtt", subs, topics)
    assert code == 0 and all(len(o["subscriptions"]) == 1 for o in out)
    assert len({o["subscriptions"][0] for o in out}) > 1
    # The default message id is the 0-based line number.
    code, again, _ = _run(tmp_path, "mqtt", subs, [{"topic": "jobs", "message_id": str(n)} for n in range(41)])
    assert again[40] == out[40]


@pytest.mark.parametrize(
    "subs_lines, topics_lines, message",
    [
        (["{not json"], [{"topic": "a"}], "subscriptions file"),
        (["[1, 2]"], [{"topic": "a"}], "line 1: not a JSON object"),
        ([{"id": 1, "filter": "a"}], ["", '"just a string"'], "topics file"),
    ],
)
def test_files_that_are_not_json_lines_exit_2(tmp_path, subs_lines, topics_lines, message):
    out, err = io.StringIO(), io.StringIO()
    code = run_match("amqp", _write(tmp_path / "s", subs_lines), _write(tmp_path / "t", topics_lines), out, err)
    assert code == 2 and out.getvalue() == ""
    assert message in err.getvalue() and err.getvalue().count("\n") == 1


def test_missing_file_or_bad_dialect_exit_2(tmp_path):
    topics = _write(tmp_path / "t", [{"topic": "a"}])
    out, err = io.StringIO(), io.StringIO()
    assert run_match("amqp", str(tmp_path / "missing.jsonl"), topics, out, err) == 2
    assert "cannot read subscriptions file" in err.getvalue() and out.getvalue() == ""
    err = io.StringIO()
    assert run_match("stomp", topics, topics, out, err) == 2
    assert "unknown dialect 'stomp'" in err.getvalue()


def test_ids_and_topics_round_trip_through_escapes(tmp_path):
    subs = ['{"id": "\\udc80", "filter": "#"}', {"id": "ü", "filter": "ü.#"}]
    code, out, err = _run(tmp_path, "amqp", subs, [{"topic": "ü.x"}, '{"topic": "\\udc80"}'])
    assert (code, err) == (0, [])
    assert out[0] == {"topic": "ü.x", "subscriptions": ["ü", "\udc80"]}
    assert "not valid UTF-8" in out[1]["error"]


def test_blank_lines_are_skipped(tmp_path):
    code, out, err = _run(tmp_path, "amqp", ["", {"id": "s", "filter": "#"}, "   "], ["", {"topic": "a"}, ""])
    assert (code, out, err) == (0, [{"topic": "a", "subscriptions": ["s"]}], [])
