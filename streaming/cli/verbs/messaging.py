"""The client verbs: ``subscribe``, ``unsubscribe``, ``publish``, ``tail``
(their Kafka side is :mod:`streaming.kafka.client_verbs`)."""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Sequence

from schemas.records import EXPIRY_HEADER, PUBLISHER_HEADER, RETAIN_HEADER, RETAIN_TRUE
from streaming.cli.arguments import config_of, message_headers
from streaming.cli.errors import UsageError, reported
from streaming.cli.times import parse_time
from streaming.config import MODE_REALTIME


def subscribe(args: argparse.Namespace) -> int:
    from streaming.kafka import client_verbs

    cfg = config_of(args)
    criteria = _criteria(args.header or [])
    if args.filter is None and not criteria:
        raise UsageError("--filter is required unless --header is given")
    filter_ = "#" if args.filter is None else args.filter
    options = _options(args)
    sub_id = args.id if args.id is not None else uuid.uuid4().hex
    with reported(client_verbs.InvalidRequest, client_verbs.ClientError,
                  cfg.kafka.client_settings):
        since = None
        if args.since is not None and cfg.streaming.mode == MODE_REALTIME:
            raise UsageError('--since (a replay) is served by streaming.mode = "microbatch"; '
                             "this configuration runs the realtime mode")
        if args.since is not None:
            from compiler import HeaderCriteria
            from streaming.router.replay import cli as replay_cli

            since = parse_time(args.since, "--since")
            replay_cli.check_since(since, args.since)
            client_verbs.subscription_record(cfg, args.exchange, args.subscriber, filter_,
                                             criteria, args.match, sub_id, since, options)
            replay_cli.check_existing(cfg, args.id, args.exchange, args.subscriber, filter_,
                                      HeaderCriteria(args.match, criteria) if criteria else None)
            notice = replay_cli.retention_start_notice(cfg, since)
            if notice is not None:
                print(f"bitroute: {notice}", file=sys.stderr, flush=True)
        record = client_verbs.subscription_record(cfg, args.exchange, args.subscriber, filter_,
                                                  criteria, args.match, sub_id, since, options)
        _check_limits(cfg, *record)
        print(client_verbs.subscribe(cfg, args.exchange, args.subscriber, filter_,
                                     criteria, args.match, sub_id, since, options))
    return 0


def _check_limits(cfg, key: bytes, value: bytes) -> None:
    """Refuse (one line, nothing written) a subscription that breaks a limit (``[limits]``)
    on the state the router would apply it to: the check the router makes
    (:func:`streaming.router.subscriptions.limits.check_limits`)."""
    from compiler import RoutingIndex, Subscription
    from streaming.ops import inspect
    from streaming.router.subscriptions.limits import LimitError, check_limits

    sub = Subscription.from_changelog(key, value)
    try:
        check_limits(RoutingIndex(cfg.exchanges.dialects), sub, cfg.limits)  # no state needed
        try:
            index = RoutingIndex.from_snapshot(inspect.load_state(cfg).snapshot)
        except inspect.InspectError:  # no router ran and no changelog yet: nothing subscribed
            return
        check_limits(index, sub, cfg.limits)
    except LimitError as exc:
        raise UsageError(str(exc)) from None


def _options(args: argparse.Namespace):
    """The MQTT subscription options of ``subscribe``'s flags (compiler.options)."""
    from compiler.options import SubscriptionOptions

    return SubscriptionOptions(args.retain_handling, args.retain_as_published, args.no_local)


def unsubscribe(args: argparse.Namespace) -> int:
    from streaming.kafka import client_verbs

    cfg = config_of(args)
    with reported(client_verbs.InvalidRequest, client_verbs.ClientError,
                  cfg.kafka.client_settings):
        client_verbs.unsubscribe(cfg, args.id)
    print(args.id)
    return 0


def retire(args: argparse.Namespace) -> int:
    from streaming.kafka import client_verbs
    from streaming.ops.retire import retire as retire_subscriber

    cfg = config_of(args)
    with reported(client_verbs.InvalidRequest, client_verbs.ClientError,
                  cfg.kafka.client_settings):
        done = retire_subscriber(cfg, args.subscriber, args.delete_topic, args.wait,
                                 lambda line: print(f"bitroute: {line}", file=sys.stderr,
                                                    flush=True))
    if args.json:
        print(json.dumps({"subscriber": done.subscriber, "subscription_ids": done.subscription_ids,
                          "topic": done.topic, "topic_deleted": done.topic_deleted}))
        return 0
    print(f"retired {done.subscriber}: {len(done.subscription_ids)} subscription"
          f"{'' if len(done.subscription_ids) == 1 else 's'} removed"
          + (f" ({', '.join(done.subscription_ids)})" if done.subscription_ids else "")
          + f"; delivery topic {done.topic} {'deleted' if done.topic_deleted else 'kept'}")
    return 0


def publish(args: argparse.Namespace) -> int:
    from streaming.kafka import client_verbs
    from streaming.router.topics.incarnations import publishing_incarnation

    cfg = config_of(args)
    headers = message_headers(args.header or [])
    payload = _payload(args)
    exchange = args.exchange or cfg.exchanges.default
    if args.retain:
        _check_retain(cfg, exchange)
        headers.append((RETAIN_HEADER, RETAIN_TRUE.encode()))
    if args.publisher is not None:
        headers.append((PUBLISHER_HEADER, _publisher(args.publisher).encode()))
    if args.expiry is not None:
        headers.append(expiry_header(args.expiry))
    with reported(client_verbs.InvalidRequest, client_verbs.ClientError,
                  cfg.kafka.client_settings):
        incarnation = publishing_incarnation(cfg)
        print(client_verbs.publish(cfg, exchange, args.routing_key, payload, headers,
                                   incarnation))
    return 0


def _publisher(name: str) -> str:
    """``--publisher``: a subscriber name (the one No Local compares it with)."""
    from compiler import SubscriptionError, validate_subscriber

    try:
        return validate_subscriber(name)
    except SubscriptionError as exc:
        raise UsageError(f"--publisher: {exc}") from None


def expiry_header(seconds: str) -> tuple[str, bytes]:
    """``--expiry SECONDS`` as the publish's ``expiry`` header, refused (one line) with the
    router's reason when the router would reject it."""
    from streaming.kafka.records import expiry_error

    value = seconds.encode("utf-8")
    reason = expiry_error(value)
    if reason is not None:
        raise UsageError(f"--expiry {seconds}: {reason}")
    return EXPIRY_HEADER, value


def _check_retain(cfg, exchange: str) -> None:
    """``--retain`` is for an MQTT exchange (an unknown one is the router's to reject)."""
    dialect = cfg.exchanges.dialects.get(exchange)
    if dialect is not None and dialect != "mqtt":
        raise UsageError(f"--retain: exchange {exchange!r} is an {dialect} exchange; retained "
                         "messages are MQTT's (exchanges.dialects)")


def _criteria(items: Sequence[str]) -> dict[str, str | None]:
    """``--header`` of subscribe: ``["color=red", "urgent"]`` -> ``{"color": "red", "urgent":
    None}`` (``NAME`` alone is presence)."""
    criteria: dict[str, str | None] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if name in criteria:
            raise UsageError(f"--header {item!r}: header {name!r} is given twice")
        criteria[name] = value if sep else None
    return criteria


def _payload(args: argparse.Namespace) -> bytes:
    if args.file is None:
        return (args.payload or "").encode("utf-8")
    if args.payload is not None:
        raise UsageError("give the payload as an argument or with --file, not both")
    if args.file == "-":
        return sys.stdin.buffer.read()
    try:
        with open(args.file, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise UsageError(f"--file {args.file}: {exc.strerror}") from None


def tail(args: argparse.Namespace) -> int:
    from streaming.cli.render import delivery_json, delivery_line
    from streaming.kafka import client_verbs

    cfg = config_of(args)

    def started(where: str) -> None:
        when = "the beginning" if args.from_beginning else "now"
        print(f"bitroute: tailing {where} from {when}", file=sys.stderr, flush=True)

    with reported(client_verbs.InvalidRequest, client_verbs.ClientError,
                  cfg.kafka.client_settings):
        for delivery in client_verbs.tail(cfg, args.subscriber, args.from_beginning, args.max,
                                    args.timeout, started):
            print(delivery_json(delivery) if args.json else delivery_line(delivery), flush=True)
    return 0
