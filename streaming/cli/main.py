"""The ``bitroute`` command line.

Every verb takes ``--config FILE`` and ``--set section.key=value`` (repeatable),
with the precedence of :mod:`streaming.config`. Errors print one line,
``bitroute: error: ...``, and exit non-zero (2 for usage and configuration, 1
for a failed operation). Heavy imports (Spark, Kafka) happen inside the verb
that needs them, so ``bitroute --help`` and ``bitroute match`` start fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from itertools import islice

from streaming.config import Config, ConfigError, load, parse_set_flags
from streaming.audit.storage import StorageError
from streaming.cli.errors import CommandError, UsageError
from streaming.errors import KafkaAccessError
from streaming.jvm import JvmResolutionError
from streaming.pack import PackError


def _config(args: argparse.Namespace, extra: dict[str, object] | None = None) -> Config:
    overrides: dict[str, object] = parse_set_flags(args.set)
    overrides.update({k: v for k, v in (extra or {}).items() if v is not None})
    return load(args.config, overrides)


# --- verbs -----------------------------------------------------------------------

def _version(args: argparse.Namespace) -> int:
    import pyspark

    from importlib import metadata  # 20 ms of imports: only for --version

    print(f"bitroute {metadata.version('bitroute')} (pyspark {pyspark.__version__}, "
          f"python {sys.version.split()[0]})")
    return 0


def _jars(args: argparse.Namespace) -> int:
    from streaming import jvm

    for group in jvm.GROUPS:
        paths = jvm.jars(group)
        print(f"{group}: {len(paths)} jars in {paths[0].parent if paths else '-'}")
    return 0


def _pack(args: argparse.Namespace) -> int:
    from streaming import pack

    packed = pack.archive()
    if args.json:
        print(json.dumps(packed.to_json()))
    else:
        pack.describe(packed, print)
    return 0


def _broker(args: argparse.Namespace) -> int:
    from streaming.kafka.broker import BrokerError, EmbeddedBroker

    cfg = _config(args, {"broker.port": args.port})
    broker = EmbeddedBroker.from_config(cfg.broker)
    try:
        if args.action == "start":
            already = broker.pid() is not None
            print(f"{broker.start()}" + (" (already running)" if already else ""))
        elif args.action == "stop":
            print("stopped" if broker.stop() else "not running")
        else:
            pid = broker.pid()
            up = pid is not None and broker.is_up()
            print(f"up {broker.bootstrap} pid {pid}" if up else "down")
            return 0 if up else 3
    except BrokerError as exc:
        raise CommandError(str(exc)) from None
    return 0


def _run(args: argparse.Namespace) -> int:
    from streaming.cli.run import serve

    return serve(_config(args))


def _match(args: argparse.Namespace) -> int:
    from streaming.cli.match import run_match

    return run_match(args.dialect, args.subscriptions, args.topics, sys.stdout, sys.stderr)


@contextmanager
def _reported(invalid: type[Exception], failed: type[Exception]) -> Iterator[None]:
    """Turn a module's errors into one-line command errors (invalid: 2, failed: 1)."""
    try:
        yield
    except invalid as exc:
        raise UsageError(str(exc)) from None
    except failed as exc:
        raise CommandError(str(exc)) from None


def _subscribe(args: argparse.Namespace) -> int:
    from streaming import client

    cfg = _config(args)
    criteria = _criteria(args.header or [])
    if args.filter is None and not criteria:
        raise UsageError("--filter is required unless --header is given")
    with _reported(client.InvalidRequest, client.ClientError):
        print(client.subscribe(cfg, args.exchange, args.subscriber,
                               "#" if args.filter is None else args.filter,
                               criteria, args.match, args.id))
    return 0


def _unsubscribe(args: argparse.Namespace) -> int:
    from streaming import client

    cfg = _config(args)
    with _reported(client.InvalidRequest, client.ClientError):
        client.unsubscribe(cfg, args.id)
    print(args.id)
    return 0


def _publish(args: argparse.Namespace) -> int:
    from streaming import client

    cfg = _config(args)
    headers = _headers(args.header or [])
    payload = _payload(args)
    with _reported(client.InvalidRequest, client.ClientError):
        print(client.publish(cfg, args.exchange or cfg.exchanges.default, args.routing_key,
                             payload, headers))
    return 0


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


def _headers(items: Sequence[str]) -> list[tuple[str, bytes]]:
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


def _tail(args: argparse.Namespace) -> int:
    from streaming import client
    from streaming.cli.render import delivery_json, delivery_line

    cfg = _config(args)

    def started(where: str) -> None:
        when = "the beginning" if args.from_beginning else "now"
        print(f"bitroute: tailing {where} from {when}", file=sys.stderr, flush=True)

    with _reported(client.InvalidRequest, client.ClientError):
        for delivery in client.tail(cfg, args.subscriber, args.from_beginning, args.max,
                                    args.timeout, started):
            print(delivery_json(delivery) if args.json else delivery_line(delivery), flush=True)
    return 0


def _audit(args: argparse.Namespace) -> int:
    from streaming.audit import queries as audit
    from streaming.cli.render import TableText, json_lines

    if args.table == "migrate":
        return _audit_migrate(args)
    cfg = _config(args)
    if args.table == "maintain":
        return _maintain(cfg, args)
    if args.maintain_table is not None:
        raise UsageError("--table goes with 'audit maintain' only")
    with _reported(audit.InvalidQuery, audit.AuditError):
        query = audit.AuditQuery(
            table=args.table, subscriber=args.subscriber, message_id=args.message_id,
            since=None if args.since is None else _time(args.since, "--since"),
            until=None if args.until is None else _time(args.until, "--until"),
            as_of_version=args.as_of_version, state=args.state)
        answer = audit.read(cfg, query, args.limit)
        # Each batch is written (and flushed) as it is read: the first rows show at once.
        text = None if args.json else TableText(answer.columns)
        try:
            for batch in answer.batches:
                _write(json_lines(batch) if text is None else text.lines(batch))
            if text is not None:
                _write(text.end())
        except BrokenPipeError:  # `| head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _write(data: bytes) -> None:
    """Write ``data`` to stdout and flush it."""
    out = getattr(sys.stdout, "buffer", None)
    if out is None:  # a text-only stdout (a test's capture)
        sys.stdout.write(data.decode())
        sys.stdout.flush()
        return
    sys.stdout.flush()
    out.write(data)
    out.flush()


def _time(text: str, flag: str) -> datetime:
    """An ISO-8601 timestamp as an aware UTC datetime; one without an offset is UTC."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"{flag}: expected an ISO-8601 timestamp such as "
                         f"2025-01-31T12:00:00Z, got {text!r}") from None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def _audit_migrate(args: argparse.Namespace) -> int:
    from streaming.audit import migration as audit_migration
    from streaming.router.lock import RouterLockedError

    given = [f"--{name.replace('_', '-')}" for name in
             ("subscriber", "message_id", "since", "until", "as_of_version", "state", "limit")
             if getattr(args, name) not in (None, False)]
    if given:
        raise UsageError(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply "
                         "to audit migrate")
    cfg = _config(args)

    def progress(line: str) -> None:
        print(f"bitroute: {line}", file=sys.stderr, flush=True)

    try:
        done = audit_migration.migrate(cfg, progress)
    except RouterLockedError as exc:
        raise CommandError(f"cannot migrate the audit tables while a router runs: {exc}") from None
    except audit_migration.MigrationError as exc:
        raise CommandError(str(exc)) from None
    for table in done:
        if args.json:
            print(json.dumps({"table": table.table, "path": table.path, "result": table.result,
                              "rows": table.rows, "version": table.version}))
        else:
            rows = f" ({table.rows:,} rows, Delta version {table.version})" \
                if table.result == "migrated" else ""
            print(f"{table.table}: {table.result}{rows}")
    return 0


def _maintain(cfg: Config, args: argparse.Namespace) -> int:
    """``bitroute audit maintain``: one maintenance pass, progress on stderr, the summary on
    stdout; exit 1 when a table's pass failed."""
    from streaming.audit import maintenance as audit_maintenance
    from streaming.cli.render import maintenance_lines

    def progress(table: str, step: str, detail: str) -> None:
        if detail != "start":
            print(f"bitroute: {table}: {step}: {detail}", file=sys.stderr, flush=True)

    tables = [args.maintain_table] if args.maintain_table else None
    report = audit_maintenance.maintain(cfg, tables=tables, progress=progress)
    if args.json:
        print(json.dumps(report.to_json(), ensure_ascii=False))
    else:
        print("\n".join(maintenance_lines(report)))
    if not report.ok:
        print(f"bitroute: error: audit maintenance failed: {report.error}", file=sys.stderr)
        return 1
    return 0


def _sql(args: argparse.Namespace) -> int:
    from streaming.audit import sql
    from streaming.cli.render import table

    cfg = _config(args)
    print("bitroute: starting Spark with Delta Lake (takes seconds; `bitroute audit` answers "
          "quick look-ups without it)", file=sys.stderr, flush=True)
    with _reported(sql.InvalidStatement, sql.SqlError):
        columns, rows = sql.run(cfg, args.statement)
    if args.json:
        _print_lines(json.dumps(row, ensure_ascii=False) for row in rows)
    else:
        print("\n".join(table(columns, rows)))
    return 0


def _status(args: argparse.Namespace) -> int:
    from streaming.cli.render import status_lines
    from streaming.ops import status

    report = status.router_status(_config(args))
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
    else:
        print("\n".join(status_lines(report)))
    return 0 if report["running"] else 3


def _explain(args: argparse.Namespace) -> int:
    from streaming.ops import inspect

    cfg = _config(args)
    headers = _headers(args.header or [])
    exchange = args.exchange or cfg.exchanges.default
    with _reported(inspect.RejectedPublish, inspect.InspectError):
        state = inspect.load_state(cfg)
        receivers = inspect.explain(state, exchange, args.routing_key, headers, args.message_id)
    _warn_stale(state)
    if args.json:
        print(json.dumps({
            "exchange": exchange, "routing_key": args.routing_key,
            "headers": {name: value.decode("utf-8") for name, value in headers},
            "message_id": args.message_id, **state.json_fields(),
            "subscribers": [{"subscriber": r.subscriber, "certain": r.certain,
                             "subscriptions": r.subscriptions} for r in receivers],
        }, ensure_ascii=False))
        return 0
    from streaming.cli.render import state_source, table

    names = [r.subscriber + ("" if r.certain else " (if chosen)") for r in receivers]
    print(f"{exchange} {args.routing_key}: "
          + (f"{len(names)} subscriber{'' if len(names) == 1 else 's'}: {', '.join(names)}"
             if names else "no subscriber")
          + f" ({state_source(state)})")
    if receivers:
        columns = ["subscriber", "subscription_id", "filter", "header_match", "header_criteria",
                   "shared_group"]
        print("\n".join(table(columns, [row for r in receivers for row in r.subscriptions])))
    return 0


def _subscriptions(args: argparse.Namespace) -> int:
    from streaming.ops import inspect

    cfg = _config(args)
    with _reported(inspect.RejectedPublish, inspect.InspectError):
        state = inspect.load_state(cfg)
    rows = inspect.subscriptions(state, args.subscriber, args.exchange)
    _warn_stale(state)
    if args.json:
        _print_lines(map(json.JSONEncoder(ensure_ascii=False).encode, rows))
        return 0
    from streaming.cli.render import state_source, table

    print(state_source(state))
    print("\n".join(table(inspect.SUBSCRIPTION_COLUMNS, rows)))
    return 0


def _print_lines(lines: Iterable[str], block: int = 4096) -> None:
    """Print ``lines`` a block at a time: one write per line is slow on an
    unbuffered stdout (PYTHONUNBUFFERED), and a listing can have millions."""
    lines = iter(lines)
    while chunk := list(islice(lines, block)):
        sys.stdout.write("\n".join(chunk) + "\n")
    sys.stdout.flush()


def _warn_stale(state) -> None:
    if state.stale is not None:
        print(f"bitroute: warning: answering from snapshot v{state.base_version} alone, "
              f"newer subscription changes are not included: {state.stale}", file=sys.stderr)


# --- parser ----------------------------------------------------------------------

def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value


def _version_number(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text}")
    return value


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help="TOML configuration file (default: the packaged conf/bitroute.toml)")
    parser.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                        help="override one configuration value (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bitroute",
        description="A topic router on Spark Structured Streaming: RabbitMQ/MQTT topic "
                    "semantics, trie matching in a Rust kernel, Kafka in and out, Delta audit.")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    def verb(name: str, handler: Callable[[argparse.Namespace], int], help_text: str
             ) -> argparse.ArgumentParser:
        sub = verbs.add_parser(name, help=help_text, description=help_text)
        _common(sub)
        sub.set_defaults(handler=handler)
        return sub

    verb("run", _run, "run the router: a long-lived Spark streaming query (Ctrl-C stops "
                      "after the current batch)")
    verb("version", _version, "print the versions of bitroute, pyspark and python")
    verb("jars", _jars, "resolve the JVM jars of conf/jvm.toml from Maven Central (cached)")

    pack = verb("pack", _pack, "pack bitroute, its kernel and dependencies for a cluster's "
                               "executors (spark.archives; cached, rebuilt when they change)")
    pack.add_argument("--json", action="store_true", help="one JSON object")

    broker = verb("broker", _broker, "start, stop or query the embedded Kafka broker")
    broker.add_argument("action", choices=("start", "stop", "status"))
    broker.add_argument("--port", type=int, help="listener port (default: broker.port)")

    match = verb("match", _match,
                 "match topics against subscriptions offline (JSON Lines in, JSON Lines out)")
    match.add_argument("--dialect", required=True, choices=("amqp", "mqtt"))
    match.add_argument("--subscriptions", required=True, metavar="SUBS.jsonl")
    match.add_argument("--topics", required=True, metavar="TOPICS.jsonl")

    subscribe = verb("subscribe", _subscribe,
                     "add or replace a subscription: validate it as the router would, create "
                     "the subscriber's delivery topic, write the change to the changelog and "
                     "print the subscription id once Kafka acknowledged it")
    subscribe.add_argument("--exchange", required=True, help="a declared exchange "
                           "(exchanges.dialects); its dialect rules the filter")
    subscribe.add_argument("--subscriber", required=True,
                           help="who receives the deliveries: 1-200 of [A-Za-z0-9._-]")
    subscribe.add_argument("--filter", help="topic filter (AMQP binding key or MQTT topic "
                           "filter); default with --header: '#', every routing key")
    subscribe.add_argument("--id", help="subscription id (default: a fresh uuid4 hex); "
                           "an existing id is replaced")
    subscribe.add_argument("--header", action="append", metavar="NAME[=VALUE]",
                           help="header criterion: NAME=VALUE (equal) or NAME (present); "
                                "repeatable")
    subscribe.add_argument("--match", choices=("all", "any"), default="all",
                           help="every header criterion must hold (all, default) or one (any)")

    unsubscribe = verb("unsubscribe", _unsubscribe,
                       "remove a subscription: write its tombstone to the changelog and print "
                       "the id once Kafka acknowledged it")
    unsubscribe.add_argument("id", metavar="ID", help="the subscription id")

    publish = verb("publish", _publish,
                   "publish one message and print its message id <topic>/<partition>/<offset> "
                   "once Kafka acknowledged it")
    publish.add_argument("--exchange", help="exchange header (default: exchanges.default)")
    publish.add_argument("--routing-key", required=True,
                         help="routing key / topic name (the router rejects a bad one)")
    publish.add_argument("--header", action="append", metavar="NAME=VALUE",
                         help="message header (repeatable)")
    publish.add_argument("payload", nargs="?", metavar="PAYLOAD",
                         help="payload text, sent as UTF-8 (default: empty)")
    publish.add_argument("--file", metavar="F", help="send the bytes of file F ('-': stdin)")

    tail = verb("tail", _tail,
                "print a subscriber's deliveries as they arrive (one line each; --json: one "
                "object per line with message_id, routing_key, headers, subscription_ids, "
                "snapshot_version, payload, payload_encoding)")
    tail.add_argument("subscriber", metavar="SUBSCRIBER")
    tail.add_argument("--from-beginning", action="store_true",
                      help="start at the oldest delivery kept (default: from now)")
    tail.add_argument("--max", type=_count, metavar="N", help="stop after N deliveries")
    tail.add_argument("--timeout", type=_seconds, metavar="SECONDS",
                      help="stop when no delivery arrived for SECONDS (default: run until "
                           "Ctrl-C)")
    tail.add_argument("--json", action="store_true", help="one JSON object per line")

    audit = verb("audit", _audit,
                 "query a Delta audit table (time column: routed_at, applied_at for "
                 "subscriptions) and print an aligned table or JSON lines; `audit maintain` "
                 "runs one maintenance pass (safe while the router runs); `audit migrate` "
                 "partitions by day the tables an earlier version created (router stopped)")
    audit.add_argument("table", choices=("deliveries", "messages", "subscriptions", "maintain",
                                         "migrate"),
                       help="the table to query; 'maintain': one maintenance pass over "
                            "the tables (compaction, retention, vacuum, checkpoint, log "
                            "cleanup; safe while the router runs); 'migrate': partition by day "
                            "the tables an earlier version created (router stopped)")
    audit.add_argument("--table", dest="maintain_table",
                       choices=("deliveries", "messages", "subscriptions"), metavar="T",
                       help="audit maintain: only table T (deliveries, messages, subscriptions)")
    audit.add_argument("--subscriber", metavar="S", help="rows of subscriber S "
                       "(deliveries, subscriptions)")
    audit.add_argument("--message-id", metavar="M", help="rows of message M "
                       "(deliveries, messages)")
    audit.add_argument("--since", metavar="T", help="rows at or after T (ISO-8601; UTC when "
                       "no offset is given)")
    audit.add_argument("--until", metavar="T", help="rows before T (ISO-8601)")
    audit.add_argument("--as-of-version", type=_version_number, metavar="V",
                       help="read the table as it was at Delta version V (time travel)")
    audit.add_argument("--state", action="store_true",
                       help="subscriptions: the subscriptions in force (latest change per id, "
                            "removed ones left out) instead of every change")
    audit.add_argument("--json", action="store_true", help="one JSON object per row")
    audit.add_argument("--limit", type=_count, metavar="N",
                       help="only the newest N rows (still oldest first), read from the "
                            "newest files back")

    sql = verb("sql", _sql,
               "run one Spark SQL statement over the audit tables, registered as deliveries, "
               "messages and subscriptions, with Delta Lake: time travel (VERSION AS OF, "
               "TIMESTAMP AS OF), DESCRIBE HISTORY, DESCRIBE DETAIL. Starting Spark takes "
               "seconds; `bitroute audit` answers quick look-ups in about one")
    sql.add_argument("statement", metavar="QUERY",
                     help="e.g. \"SELECT subscriber, count(*) FROM deliveries GROUP BY subscriber\" "
                          "or \"DESCRIBE HISTORY deliveries\"")
    sql.add_argument("--json", action="store_true", help="one JSON object per row")

    status = verb("status", _status,
                  "is a router running on this configuration, what did it last do, how far "
                  "behind is it (exit status 0 when running, 3 when not)")
    status.add_argument("--json", action="store_true", help="one JSON object")

    explain = verb("explain", _explain,
                   "who would receive this publish now: match it against the router's latest "
                   "snapshot plus the newer changelog records (or the whole changelog when no "
                   "router ran), without publishing anything")
    explain.add_argument("--exchange", help="the publish's exchange (default: exchanges.default)")
    explain.add_argument("--routing-key", required=True, help="routing key / topic name")
    explain.add_argument("--header", action="append", metavar="NAME=VALUE",
                         help="message header (repeatable; the last value of a name counts)")
    explain.add_argument("--message-id", metavar="M",
                         help="<topic>/<partition>/<offset>: pick each shared group's member as "
                              "the router would for message M (default: list every member)")
    explain.add_argument("--json", action="store_true", help="one JSON object")

    subscriptions = verb("subscriptions", _subscriptions,
                         "list the live subscriptions (the latest snapshot plus the newer "
                         "changelog records; not the change history: see audit subscriptions)")
    subscriptions.add_argument("--subscriber", metavar="S", help="only subscriber S's")
    subscriptions.add_argument("--exchange", metavar="E", help="only exchange E's")
    subscriptions.add_argument("--json", action="store_true", help="one JSON object per line")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from streaming.cli.logs import configure_logging

    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging()
    try:
        return args.handler(args)
    except ConfigError as exc:
        print(f"bitroute: error: configuration: {exc}", file=sys.stderr)
        return 2
    except UsageError as exc:
        print(f"bitroute: error: {exc}", file=sys.stderr)
        return 2
    except (CommandError, JvmResolutionError, KafkaAccessError, StorageError, PackError) as exc:
        print(f"bitroute: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
