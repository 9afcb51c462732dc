"""docs/cli.md is the parser's own reference: generated, and checked against it."""

from __future__ import annotations

import argparse

from streaming.cli import reference
from streaming.cli.parser import build_parser, exit_statuses


def test_the_page_is_what_the_parser_renders():
    """A flag, default, help text or exit status changed in the parser without
    `python -m streaming.cli.reference --write` fails here."""
    assert reference.PAGE.read_text() == reference.render(), (
        "docs/cli.md is stale: run `python -m streaming.cli.reference --write`")


def test_every_verb_and_flag_has_its_row():
    page = reference.render()
    parser = build_parser()
    [verbs] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(verbs.choices) >= 15
    for name, sub in verbs.choices.items():
        section = page.split(f"## bitroute {name}\n", 1)[1].split("\n## ", 1)[0]
        for action in sub._actions:
            if action.dest in ("help", "config", "set"):
                continue
            shown = action.option_strings[0] if action.option_strings else (
                action.metavar or action.dest)
            assert f"`{shown}`" in section, (name, shown)


def test_a_verbs_own_exit_statuses_replace_the_shared_ones():
    build_parser()
    assert exit_statuses("status")[3] == "no router is running on this configuration"
    assert 130 not in exit_statuses("run")
    assert set(exit_statuses("publish")) == {0, 1, 2, 130}


def test_help_ends_with_the_exit_statuses(cli):
    result = cli("status", "--help")
    assert result.returncode == 0
    assert "exit status: 0: a router is running" in " ".join(result.stdout.split())
