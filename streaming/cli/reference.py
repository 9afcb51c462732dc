"""docs/cli.md, the command-line reference, rendered from the parser itself
(:func:`streaming.cli.parser.build_parser`): every verb, its usage, each argument with its
value, default and help, and the exit statuses. The page is generated, never edited by
hand, and ``tests/streaming/cli/test_reference.py`` fails when it and the parser disagree.

    python -m streaming.cli.reference            # print the page
    python -m streaming.cli.reference --write    # write docs/cli.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from streaming.cli.parser import build_parser, exit_statuses

PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
USAGE_WIDTH = 100
"""Usage lines wrap at this width whatever the terminal's, so the page is the same
everywhere."""

_HEADER = """\
# The `bitroute` command line

<!-- Generated from streaming/cli/parser.py by `python -m streaming.cli.reference --write`;
tests/streaming/cli/test_reference.py fails when this page and the parser disagree.
Do not edit by hand. -->

Every verb also takes `--config FILE` (a TOML configuration file; default: the packaged
conf/bitroute.toml) and `--set SECTION.KEY=VALUE` (one configuration value, repeatable),
with the precedence of docs/running.md, "Settings". Errors print one line,
`bitroute: error: ...`, on stderr; `--json` output is JSON only, one object per line.
`bitroute VERB --help` prints the same as the verb's section here.

"""


def _verbs(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [subparsers] = [action for action in parser._actions
                    if isinstance(action, argparse._SubParsersAction)]
    return dict(subparsers.choices)


def _usage(sub: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(prog=sub.prog, width=USAGE_WIDTH)
    formatter.add_usage(sub.usage, sub._actions, sub._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _names(action: argparse.Action) -> str:
    if action.option_strings:
        return ", ".join(f"`{name}`" for name in action.option_strings)
    return f"`{action.metavar or action.dest}`"


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices is not None:
        return " \\| ".join(f"`{choice}`" for choice in action.choices)
    metavar = action.metavar or action.dest.upper()
    return f"`{metavar}`"


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if isinstance(action, argparse._AppendAction):
        return "none (repeatable)"
    if action.nargs == 0:
        return "off"
    if not action.option_strings and action.nargs == "?":
        return "optional"
    if action.default is None:
        return ""
    return f"`{action.default}`"


def _arguments(sub: argparse.ArgumentParser) -> list[str]:
    rows = ["| argument | value | default | meaning |", "| --- | --- | --- | --- |"]
    for action in sub._actions:
        if isinstance(action, argparse._HelpAction) or action.dest in ("config", "set"):
            continue
        rows.append(f"| {_names(action)} | {_value(action)} | {_default(action)} | "
                    f"{_cell(action.help or '')} |")
    return rows if len(rows) > 2 else ["No arguments but `--config` and `--set`."]


def render() -> str:
    """The whole page, as docs/cli.md holds it."""
    parser = build_parser()
    verbs = _verbs(parser)
    lines = [_HEADER.rstrip("\n"), "", "| verb | what it does |", "| --- | --- |"]
    lines += [f"| [`{name}`](#bitroute-{name}) | {_cell(sub.description or '')} |"
              for name, sub in verbs.items()]
    for name, sub in verbs.items():
        lines += ["", f"## bitroute {name}", "", " ".join((sub.description or "").split()), "",
                  "```", _usage(sub), "```", "", *_arguments(sub), "", "Exit status:", ""]
        lines += [f"- {status}: {meaning}" for status, meaning in exit_statuses(name).items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m streaming.cli.reference",
                                 description="print docs/cli.md, or write it (--write)")
    ap.add_argument("--write", action="store_true", help=f"write {PAGE}")
    args = ap.parse_args(argv)
    page = render()
    if args.write:
        PAGE.write_text(page)
        print(f"wrote {PAGE}", file=sys.stderr)
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
