"""The verbs of bitroute's installation and its local broker: ``version``, ``jars``,
``pack``, ``broker``."""

from __future__ import annotations

import argparse
import json
import sys

from streaming.cli.arguments import config_of
from streaming.cli.errors import CommandError


def version(args: argparse.Namespace) -> int:
    from importlib import metadata  # 20 ms of imports: only for --version

    import pyspark

    print(f"bitroute {metadata.version('bitroute')} (pyspark {pyspark.__version__}, "
          f"python {sys.version.split()[0]})")
    return 0


def jars(args: argparse.Namespace) -> int:
    from streaming import jvm
    from streaming.realtime.jar import realtime_jar

    for group in (*jvm.GROUPS, "s3a") if args.s3a else jvm.GROUPS:
        paths = jvm.jars(group)
        print(f"{group}: {len(paths)} jars in {paths[0].parent if paths else '-'}")
    print(f"realtime: {realtime_jar()}")
    return 0


def pack(args: argparse.Namespace) -> int:
    from streaming import pack

    packed = pack.archive()
    if args.json:
        print(json.dumps(packed.to_json()))
    else:
        pack.describe(packed, print)
    return 0


def broker(args: argparse.Namespace) -> int:
    from streaming.kafka.broker import BrokerError, EmbeddedBroker

    cfg = config_of(args, {"broker.port": args.port})
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
