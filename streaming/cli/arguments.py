"""What every verb reads from its arguments: the configuration (``--config`` and
``--set``, with the precedence of :mod:`streaming.config`) and a publish's headers
(``--header NAME=VALUE`` of publish and explain)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from streaming.cli.errors import UsageError
from streaming.config import Config, load, parse_set_flags


def config_of(args: argparse.Namespace, extra: dict[str, object] | None = None) -> Config:
    overrides: dict[str, object] = dict(parse_set_flags(args.set))
    overrides.update({k: v for k, v in (extra or {}).items() if v is not None})
    return load(args.config, overrides)


def message_headers(items: Sequence[str]) -> list[tuple[str, bytes]]:
    """``--header`` of publish and explain: ``["color=red"]`` -> ``[("color", b"red")]``;
    names may repeat, as Kafka allows; the router's own headers may not be given."""
    from schemas.records import EXCHANGE_HEADER, ROUTER_HEADERS

    headers = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--header {item!r}: expected NAME=VALUE")
        if name == EXCHANGE_HEADER:
            raise UsageError(f"--header {item!r}: give the exchange with --exchange")
        if name in ROUTER_HEADERS:
            raise UsageError(f"--header {item!r}: {name!r} is set by the router")
        headers.append((name, value.encode("utf-8")))
    return headers
