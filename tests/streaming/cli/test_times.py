"""The command line's one time grammar (:mod:`streaming.cli.times`), which every
``--since``/``--until`` flag reads, and the flags that use it."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

import pytest

from streaming.cli.errors import UsageError
from streaming.cli.parser import build_parser
from streaming.cli.times import FORMS, parse_time

NOW = datetime(2026, 11, 26, 18, 0, tzinfo=UTC)


@pytest.mark.parametrize("text, expected", [
    # ISO-8601, with a zone
    ("2026-11-26T17:00:00Z", datetime(2026, 11, 26, 17, tzinfo=UTC)),
    ("2026-11-26T18:00:00+01:00", datetime(2026, 11, 26, 17, tzinfo=UTC)),
    ("2026-11-26T12:00:00-05:00", datetime(2026, 11, 26, 17, tzinfo=UTC)),
    # ISO-8601 without a zone: UTC; a date alone is its midnight
    ("2026-11-26T17:00:00", datetime(2026, 11, 26, 17, tzinfo=UTC)),
    ("2026-11-26 17:00:00.500", datetime(2026, 11, 26, 17, 0, 0, 500_000, tzinfo=UTC)),
    ("2026-11-26", datetime(2026, 11, 26, tzinfo=UTC)),
    ("0001-01-01", datetime(1, 1, 1, tzinfo=UTC)),
    ("9999-12-31", datetime(9999, 12, 31, tzinfo=UTC)),
    (" 2026-11-26T17:00:00Z ", datetime(2026, 11, 26, 17, tzinfo=UTC)),
    # a duration back from now
    ("90s", NOW - timedelta(seconds=90)),
    ("15m", NOW - timedelta(minutes=15)),
    ("2h", NOW - timedelta(hours=2)),
    ("7d", NOW - timedelta(days=7)),
    ("1h30m", NOW - timedelta(minutes=90)),
    ("1d12h5m3s", NOW - timedelta(days=1, hours=12, minutes=5, seconds=3)),
    ("0s", NOW),
])
def test_a_time_is_an_iso_8601_time_or_a_duration_back_from_now(text, expected):
    when = parse_time(text, "--since", NOW)
    assert when == expected and when.tzinfo == UTC


@pytest.mark.parametrize("text", [
    "", " ", "yesterday", "2x", "1m2h", "h", "-2h", "1.5h", "2 h", "2026-13-01",
    "2026-11-26T25:00:00", "99999999d", "9999-12-31T23:00:00-05:00",
])
def test_anything_else_is_one_line_naming_the_flag_the_value_and_the_forms(text):
    with pytest.raises(UsageError) as raised:
        parse_time(text, "--until", NOW)
    assert str(raised.value) == f"--until {text!r}: expected {FORMS}"
    assert "\n" not in str(raised.value)


def test_a_duration_counts_back_from_the_clock_by_default():
    before = datetime.now(UTC)
    when = parse_time("1h", "--since")
    assert before - timedelta(hours=1) <= when <= datetime.now(UTC) - timedelta(hours=1)


def _time_flags(parser: argparse.ArgumentParser, verb: str = ""):
    """Every (verb, flag, help) of a --since or --until flag in the parser's tree."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _time_flags(sub, f"{verb} {name}".strip())
        elif {"--since", "--until"} & set(action.option_strings):
            yield verb, action.option_strings[0], action.help


def test_every_since_and_until_flag_states_the_one_grammar():
    flags = list(_time_flags(build_parser()))
    assert {(verb, flag) for verb, flag, _ in flags} >= {
        ("subscribe", "--since"), ("audit", "--since"), ("audit", "--until")}
    assert all(FORMS in help_ for _, _, help_ in flags)


@pytest.mark.parametrize("args, flag, value", [
    (["subscribe", "--exchange", "amq.topic", "--subscriber", "s", "--filter", "a.*",
      "--since", "yesterday"], "--since", "yesterday"),
    (["audit", "messages", "--until", "2h30"], "--until", "2h30"),
])
def test_the_verbs_refuse_a_bad_time_with_the_one_line_and_status_2(cli, args, flag, value):
    """Refused before anything is read or written (no broker, no table is reached)."""
    result = cli(*args, settings={"kafka.bootstrap": "127.0.0.1:9"})
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [f"bitroute: error: {flag} {value!r}: expected {FORMS}"]
