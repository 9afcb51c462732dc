"""The ``bitroute`` command line's parser: every verb, its flags and its help, and the
handler it dispatches to (:mod:`streaming.cli.verbs`). The verbs, flags and texts here are
public contracts."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from streaming.cli.times import FORMS
from streaming.cli.verbs import audit as audit_verbs, inspection, installation, messaging, router


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


EXIT_STATUSES: dict[int, str] = {
    0: "done",
    1: "the operation failed: one line on stderr says what failed and what to do",
    2: "invalid arguments or configuration: one line on stderr, nothing was done",
    130: "interrupted (Ctrl-C)",
}
"""The exit statuses every verb shares (:mod:`streaming.cli.main`); a verb's own
meanings are given to :func:`build_parser`'s ``verb`` and replace or extend these."""

_verb_exit_statuses: dict[str, dict[int, str | None]] = {}


def exit_statuses(verb: str) -> dict[int, str]:
    """Verb ``verb``'s exit statuses and their meanings, by status (after
    :func:`build_parser` ran): the shared ones with the verb's own over them (a verb's
    None: the verb never exits with that status)."""
    merged = {**EXIT_STATUSES, **_verb_exit_statuses.get(verb, {})}
    return {status: meaning for status, meaning in sorted(merged.items()) if meaning is not None}


def _epilog(statuses: dict[int, str]) -> str:
    return "exit status: " + "; ".join(f"{status}: {meaning}"
                                       for status, meaning in statuses.items())


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help="TOML configuration file (default: the packaged conf/bitroute.toml)")
    parser.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                        help="override one configuration value (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bitroute",
        description="A topic router on Spark Structured Streaming: RabbitMQ/MQTT topic "
                    "semantics, trie matching in a Rust kernel, Kafka in and out, Delta audit.",
        epilog="Every verb, flag, default and exit status: docs/cli.md.")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    def verb(name: str, handler: Callable[[argparse.Namespace], int], help_text: str,
             exits: dict[int, str | None] | None = None) -> argparse.ArgumentParser:
        _verb_exit_statuses[name] = dict(exits or {})
        sub = verbs.add_parser(name, help=help_text, description=help_text,
                               epilog=_epilog(exit_statuses(name)))
        _common(sub)
        sub.set_defaults(handler=handler)
        return sub

    run = verb("run", router.run, "run the router: a long-lived Spark streaming query (Ctrl-C "
                                  "stops after the current batch)",
               {0: "stopped by SIGINT or SIGTERM, after the batch in progress",
                1: "the router could not start or its query failed (one line on stderr says "
                   "what to do), or a second signal ended it at once",
                130: None})
    run.add_argument("--json", action="store_true",
                     help="one JSON object per finished batch on stdout instead of the progress "
                          "line; every other line on stderr")
    run.add_argument("--accept-retention-gap", action="store_true",
                     help="record the publishes Kafka deleted before the router read them, met "
                          "by this run's first batch (realtime mode: its routing query's first "
                          "start), and route on (streaming.on_retention_gap = \"stop\" stopped "
                          "the router on them)")
    verb("version", installation.version,
         "print the versions of bitroute, pyspark and python")
    jars = verb("jars", installation.jars,
                "resolve the JVM jars of conf/jvm.toml from Maven Central and build the realtime "
                "jar (cached)")
    jars.add_argument("--s3a", action="store_true",
                      help="also Hadoop's S3A connector (the [s3a] group, about 650 MB), which "
                           "`bitroute sql` needs on an s3:// warehouse and otherwise resolves "
                           "with Maven at its first use (the Docker image has it)")

    pack = verb("pack", installation.pack,
                "pack bitroute, its kernel and dependencies for a cluster's "
                "executors (spark.archives; cached, rebuilt when they change)")
    pack.add_argument("--json", action="store_true", help="one JSON object")

    broker = verb("broker", installation.broker,
                  "start, stop or query the embedded Kafka broker",
                  {0: "done (status: the broker is up)",
                   3: "status: the broker is down"})
    broker.add_argument("action", choices=("start", "stop", "status"))
    broker.add_argument("--port", type=int, help="listener port (default: broker.port)")

    match = verb("match", router.match,
                 "match topics against subscriptions offline (JSON Lines in, JSON Lines out)",
                 {0: "both files were read (rejected subscriptions included, one JSON object "
                     "each on stderr)",
                  2: "a file cannot be read, a non-blank line is not a JSON object, or the "
                     "dialect is unknown: one line on stderr, nothing on stdout"})
    match.add_argument("--dialect", required=True, choices=("amqp", "mqtt"))
    match.add_argument("--subscriptions", required=True, metavar="SUBS.jsonl")
    match.add_argument("--topics", required=True, metavar="TOPICS.jsonl")

    subscribe = verb("subscribe", messaging.subscribe,
                     "add or replace a subscription: validate it as the router would, create "
                     "the subscriber's delivery topic, write the change to the changelog and "
                     "print the subscription id once Kafka acknowledged it; a subscription "
                     "that breaks a limit ([limits]: subscriptions per subscriber and per "
                     "exchange, filter levels and length, header criteria) is refused with "
                     "one line naming it, nothing written")
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
    subscribe.add_argument("--since", metavar="T",
                           help="also replay the publishes Kafka keeps at or after T "
                                f"that the subscription matches, then the live stream; T: {FORMS}; "
                                "docs/design.md, \"Replay\"")
    subscribe.add_argument("--retain-handling", type=int, choices=(0, 1, 2), default=0,
                           help="MQTT exchanges only: when the router applies the subscription, "
                                "deliver the retained messages it matches (marked "
                                "bitroute.retained: true) on every subscribe, a re-subscribe of "
                                "the same id and definition included (0, default); only when "
                                "the id did not exist before (1); never (2); docs/design.md, "
                                "\"Retained messages\"")
    subscribe.add_argument("--retain-as-published", action="store_true",
                           help="MQTT exchanges only: a live delivery of a retained publish "
                                "keeps its header retain: true (default: a live delivery "
                                "carries no retain header, as MQTT 5 requires of a server; a "
                                "retained message delivered when the subscription is applied "
                                "always carries it)")
    subscribe.add_argument("--no-local", action="store_true",
                           help="MQTT exchanges only, not $share/: a publish is never delivered "
                                "through this subscription to the subscriber that published it "
                                "(its last header publisher names the subscriber: publish "
                                "--publisher)")

    unsubscribe = verb("unsubscribe", messaging.unsubscribe,
                       "remove a subscription: write its tombstone to the changelog and print "
                       "the id once Kafka acknowledged it")
    unsubscribe.add_argument("id", metavar="ID", help="the subscription id")

    retire = verb("retire", messaging.retire,
                  "retire a subscriber: remove each of its live subscriptions through the "
                  "changelog (the audit records why) and keep its delivery topic, or delete it "
                  "once the router has routed what was published before")
    retire.add_argument("subscriber", metavar="SUBSCRIBER")
    retire.add_argument("--delete-topic", action="store_true",
                        help="also delete the subscriber's delivery topic (default: keep it; "
                             "not in the shared layout)")
    retire.add_argument("--wait", type=_seconds, default=60.0, metavar="SECONDS",
                        help="--delete-topic: how long to wait for a running router to route "
                             "the publishes written before the retirement (default 60)")
    retire.add_argument("--json", action="store_true", help="one JSON object")

    publish = verb("publish", messaging.publish,
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
    publish.add_argument("--retain", action="store_true",
                         help="MQTT exchanges only: the publish becomes its topic's retained "
                              "message (an empty payload clears it), delivered to the "
                              "subscriptions it matches when the router applies them (subscribe "
                              "--retain-handling) (header retain=true; docs/design.md, "
                              "\"Retained messages\")")
    publish.add_argument("--publisher", metavar="NAME",
                         help="who publishes: a subscriber name, sent as the header "
                              "publisher=NAME; a subscription of NAME with --no-local is not "
                              "delivered this publish")
    publish.add_argument("--expiry", metavar="SECONDS",
                         help="MQTT 5's Message Expiry Interval, 1 to 4294967295 (header "
                              "expiry=SECONDS): routed after SECONDS it is delivered to no one "
                              "(messages outcome 'expired'); each delivery carries the interval "
                              "left; a retained message stops being served when it expires; a "
                              "replay skips it once expired (docs/design.md, \"Message expiry\")")

    tail = verb("tail", messaging.tail,
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

    audit = verb("audit", audit_verbs.audit,
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
    audit.add_argument("--since", metavar="T", help=f"rows at or after T; T: {FORMS}")
    audit.add_argument("--until", metavar="T", help=f"rows before T; T: {FORMS}")
    audit.add_argument("--as-of-version", type=_version_number, metavar="V",
                       help="read the table as it was at Delta version V (time travel)")
    audit.add_argument("--state", action="store_true",
                       help="subscriptions: the subscriptions in force (latest change per id, "
                            "removed ones left out) instead of every change")
    audit.add_argument("--replayed", action="store_true",
                       help="deliveries: only those a replay made (subscribe --since)")
    audit.add_argument("--retained", action="store_true",
                       help="deliveries: only the retained messages delivered when a "
                            "subscription was applied")
    audit.add_argument("--json", action="store_true", help="one JSON object per row")
    audit.add_argument("--limit", type=_count, metavar="N",
                       help="only the newest N rows (still oldest first), read from the "
                            "newest files back")

    sql = verb("sql", audit_verbs.sql,
               "run one Spark SQL statement over the audit tables, registered as deliveries, "
               "messages and subscriptions, with Delta Lake: time travel (VERSION AS OF, "
               "TIMESTAMP AS OF), DESCRIBE HISTORY, DESCRIBE DETAIL. Starting Spark takes "
               "seconds; `bitroute audit` answers quick look-ups in about one")
    sql.add_argument("statement", metavar="QUERY",
                     help="e.g. \"SELECT subscriber, count(*) FROM deliveries GROUP BY subscriber\" "
                          "or \"DESCRIBE HISTORY deliveries\"")
    sql.add_argument("--json", action="store_true", help="one JSON object per row")

    status = verb("status", inspection.status,
                  "is a router running on this configuration, what did it last do (publishes "
                  "rejected, expired, lost), how far behind is it, what each exchange uses of "
                  "its [limits] (exit status 0 when running, 3 when not)",
                  {0: "a router is running on this configuration",
                   3: "no router is running on this configuration"})
    status.add_argument("--json", action="store_true", help="one JSON object")

    explain = verb("explain", inspection.explain,
                   "who would receive this publish now: match it against the router's latest "
                   "snapshot plus the newer changelog records (or the whole changelog when no "
                   "router ran), without publishing anything")
    explain.add_argument("--exchange", help="the publish's exchange (default: exchanges.default)")
    explain.add_argument("--routing-key", required=True, help="routing key / topic name")
    explain.add_argument("--header", action="append", metavar="NAME=VALUE",
                         help="message header (repeatable; the last value of a name counts)")
    explain.add_argument("--expiry", metavar="SECONDS",
                         help="the publish's expiry interval (header expiry=SECONDS): checked "
                              "as the router checks it, and shown")
    explain.add_argument("--message-id", metavar="M",
                         help="<topic>/<partition>/<offset>: pick each shared group's member as "
                              "the router would for message M (default: list every member)")
    explain.add_argument("--json", action="store_true", help="one JSON object")

    subscriptions = verb("subscriptions", inspection.subscriptions,
                         "list the live subscriptions (the latest snapshot plus the newer "
                         "changelog records; not the change history: see audit subscriptions), "
                         "then each listed subscriber's subscriptions per exchange against "
                         "limits.max_subscriptions_per_subscriber")
    subscriptions.add_argument("--subscriber", metavar="S", help="only subscriber S's")
    subscriptions.add_argument("--exchange", metavar="E", help="only exchange E's")
    subscriptions.add_argument("--json", action="store_true", help="one JSON object per line")
    return parser
