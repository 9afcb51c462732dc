"""The ``bitroute`` command line.

Every verb takes ``--config FILE`` and ``--set section.key=value`` (repeatable),
with the precedence of :mod:`streaming.config`. Errors print one line,
``bitroute: error: ...``, and exit non-zero (2 for usage and configuration, 1
for a failed operation). Heavy imports (Spark, Kafka) happen inside the verb
that needs them, so ``bitroute --help`` and ``bitroute match`` start fast.

:func:`main` parses (:mod:`streaming.cli.parser`), calls the verb's handler
(:mod:`streaming.cli.verbs`) and turns its errors into the line and the exit status.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from streaming.audit.storage import StorageError
from streaming.cli.errors import CommandError, UsageError
from streaming.cli.parser import build_parser
from streaming.config import ConfigError
from streaming.errors import KafkaAccessError
from streaming.jvm import JvmResolutionError
from streaming.pack import PackError


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
