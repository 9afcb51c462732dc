"""The verbs that look at a router's state: ``status``, ``explain``, ``subscriptions``."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from schemas.records import EXPIRY_HEADER
from streaming.cli.arguments import config_of, message_headers
from streaming.cli.errors import reported
from streaming.cli.output import print_lines
from streaming.cli.verbs.messaging import expiry_header


def status(args: argparse.Namespace) -> int:
    from streaming.cli.render import status_lines
    from streaming.ops import status

    report = status.router_status(config_of(args))
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
    else:
        print("\n".join(status_lines(report)))
    return 0 if report["running"] else 3


def explain(args: argparse.Namespace) -> int:
    from streaming.ops import inspect

    cfg = config_of(args)
    headers = message_headers(args.header or [])
    if args.expiry is not None:
        headers.append(expiry_header(args.expiry))
    expiry = dict(headers).get(EXPIRY_HEADER)
    exchange = args.exchange or cfg.exchanges.default
    alternate = cfg.exchanges.alternate(exchange)
    with reported(inspect.RejectedPublish, inspect.InspectError, cfg.kafka.client_settings):
        state = inspect.load_state(cfg)
        receivers = inspect.explain(state, exchange, args.routing_key, headers, args.message_id)
        through = None
        if not receivers and alternate is not None:
            # Routed to no one: the router matches it once on the exchange's alternate.
            receivers = inspect.explain(state, alternate, args.routing_key, headers,
                                        args.message_id)
            through = alternate if receivers else None
    mqtt = cfg.exchanges.dialects.get(exchange) == "mqtt"
    retained = inspect.retained_of(cfg, state, exchange, args.routing_key) if mqtt else None
    _warn_stale(state)
    if args.json:
        print(json.dumps({
            "exchange": exchange, "routing_key": args.routing_key,
            "headers": {name: value.decode("utf-8") for name, value in headers},
            "message_id": args.message_id, **state.json_fields(),
            "alternate_exchange": through,
            "expiry": None if expiry is None else int(expiry),
            "subscribers": [{"subscriber": r.subscriber, "certain": r.certain,
                             "subscriptions": r.subscriptions} for r in receivers],
            **({"retained": retained} if mqtt else {}),
        }, ensure_ascii=False))
        return 0
    from streaming.cli.render import state_source, table

    names = [r.subscriber + ("" if r.certain else " (if chosen)") for r in receivers]
    print(f"{exchange} {args.routing_key}: "
          + ("no subscriber; through its alternate exchange "
             f"{through} (exchanges.alternates): " if through is not None else "")
          + (f"{len(names)} subscriber{'' if len(names) == 1 else 's'}: {', '.join(names)}"
             if names else "no subscriber")
          + ("" if names or alternate is None else
             f", nor on its alternate exchange {alternate}")
          + f" ({state_source(state)})")
    if expiry is not None:
        print(f"expiry: {int(expiry)} s; each delivery carries it less the whole seconds the "
              "message waited, and a publish routed after it is delivered to no one (expired)")
    if receivers:
        columns = ["subscriber", "subscription_id", "filter", "header_match", "header_criteria",
                   "shared_group", *(inspect.OPTION_COLUMNS if mqtt else ())]
        print("\n".join(table(columns, [row for r in receivers for row in r.subscriptions])))
    if mqtt:
        left = None if retained is None else retained["expiry_remaining"]
        print(f"retained message: {retained['message_id']} ({retained['payload_bytes']} bytes, "
              f"published {retained['published_at']}"
              + ("" if left is None else f", expires in {left} s") + ")"
              if retained is not None else "retained message: none")
    return 0


def subscriptions(args: argparse.Namespace) -> int:
    from streaming.ops import inspect

    cfg = config_of(args)
    with reported(inspect.RejectedPublish, inspect.InspectError, cfg.kafka.client_settings):
        state = inspect.load_state(cfg)
    rows = inspect.with_retained(cfg, state,
                                 inspect.subscriptions(state, args.subscriber, args.exchange))
    _warn_stale(state)
    if args.json:
        print_lines(map(json.JSONEncoder(ensure_ascii=False).encode, rows))
        return 0
    from streaming.cli.render import state_source, table

    print(state_source(state))
    mqtt = any(cfg.exchanges.dialects.get(r["exchange"]) == "mqtt" for r in rows)
    columns = [c for c in inspect.SUBSCRIPTION_COLUMNS
               if mqtt or c not in inspect.OPTION_COLUMNS] + (
        ["retained"] if any("retained" in r for r in rows) else [])
    print("\n".join(table(columns, [{"retained": None, **row} for row in rows])))
    # Each listed subscriber's use of its limit, per exchange ([limits]).
    counts = Counter((row["exchange"], row["subscriber"]) for row in rows)
    for exchange, subscriber in sorted(counts):
        limit = cfg.limits.of(exchange, "max_subscriptions_per_subscriber")
        print(f"{subscriber} on {exchange}: {counts[exchange, subscriber]:,} of "
              f"{cfg.limits.key(exchange, 'max_subscriptions_per_subscriber')} = {limit:,}")
    return 0


def _warn_stale(state) -> None:
    if state.stale is not None:
        print(f"bitroute: warning: answering from snapshot v{state.base_version} alone, "
              f"newer subscription changes are not included: {state.stale}", file=sys.stderr)
