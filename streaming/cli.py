"""The ``bitroute`` command line.

Every verb takes ``--config FILE`` and ``--set section.key=value`` (repeatable),
with the precedence of :mod:`streaming.config`. Errors print one line,
``bitroute: error: ...``, and exit non-zero (2 for usage and configuration, 1
for a failed operation). Heavy imports (Spark, Kafka) happen inside the verb
that needs them, so ``bitroute --help`` and ``bitroute match`` start fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib import metadata

from streaming.config import Config, ConfigError, load, parse_set_flags
from streaming.jvm import JvmResolutionError


class CommandError(RuntimeError):
    """A verb failed in a way the user can act on; printed as one line."""


def _config(args: argparse.Namespace, extra: dict[str, object] | None = None) -> Config:
    overrides: dict[str, object] = parse_set_flags(args.set)
    overrides.update({k: v for k, v in (extra or {}).items() if v is not None})
    return load(args.config, overrides)


# --- verbs -----------------------------------------------------------------------

def _version(args: argparse.Namespace) -> int:
    import pyspark

    print(f"bitroute {metadata.version('bitroute')} (pyspark {pyspark.__version__}, "
          f"python {sys.version.split()[0]})")
    return 0


def _jars(args: argparse.Namespace) -> int:
    from streaming import jvm

    for group in jvm.GROUPS:
        paths = jvm.jars(group)
        print(f"{group}: {len(paths)} jars in {paths[0].parent if paths else '-'}")
    return 0


def _broker(args: argparse.Namespace) -> int:
    from streaming.broker import BrokerError, EmbeddedBroker

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
    from streaming.router import serve

    return serve(_config(args))


def _match(args: argparse.Namespace) -> int:
    from compiler.offline import run_match

    return run_match(args.dialect, args.subscriptions, args.topics, sys.stdout, sys.stderr)


# --- parser ----------------------------------------------------------------------

def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help="TOML configuration file (default: the packaged conf/bitroute.toml)")
    parser.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                        help="override one configuration value (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bitroute",
        description="A topic router on Spark Structured Streaming: RabbitMQ/MQTT topic "
                    "semantics, inverted-bitmap matching, Kafka in and out, Delta audit.")
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

    broker = verb("broker", _broker, "start, stop or query the embedded Kafka broker")
    broker.add_argument("action", choices=("start", "stop", "status"))
    broker.add_argument("--port", type=int, help="listener port (default: broker.port)")

    match = verb("match", _match,
                 "match topics against subscriptions offline (JSON Lines in, JSON Lines out)")
    match.add_argument("--dialect", required=True, choices=("amqp", "mqtt"))
    match.add_argument("--subscriptions", required=True, metavar="SUBS.jsonl")
    match.add_argument("--topics", required=True, metavar="TOPICS.jsonl")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except ConfigError as exc:
        print(f"bitroute: error: configuration: {exc}", file=sys.stderr)
        return 2
    except (CommandError, JvmResolutionError) as exc:
        print(f"bitroute: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
