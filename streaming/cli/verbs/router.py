"""The verbs that route: ``run`` (the router, :mod:`streaming.cli.run`) and ``match``
(offline matching, :mod:`streaming.cli.match`)."""

from __future__ import annotations

import argparse
import sys

from streaming.cli.arguments import config_of


def run(args: argparse.Namespace) -> int:
    from streaming.cli.run import serve

    return serve(config_of(args), json_lines=args.json,
                 accept_retention_gap=args.accept_retention_gap)


def match(args: argparse.Namespace) -> int:
    from streaming.cli.match import run_match

    return run_match(args.dialect, args.subscriptions, args.topics, sys.stdout, sys.stderr)
