"""The root of every error ``streaming/`` raises on purpose, and the one-line form of any error.

``except BitrouteError`` catches what the router, the client verbs and the
CLI report as one line; anything else is a bug or a library's own failure.
This module holds the root and the errors of the package's top-level modules
(:class:`ConfigError`, :class:`PackError`, :class:`JvmResolutionError`,
:class:`RealtimeBuildError`); each
subpackage keeps its own in its ``errors`` module (:mod:`streaming.kafka.errors`,
:mod:`streaming.router.errors`, :mod:`streaming.state.errors`, :mod:`streaming.audit.errors`,
:mod:`streaming.ops.errors`, :mod:`streaming.cli.errors`), all under
:class:`BitrouteError`; the modules that raise them re-export them, so
``from streaming.state.lock import RouterLockedError`` keeps working.
(:mod:`compiler` is a lower layer that does not import ``streaming``: its
errors, all bad input, have their own root, :class:`compiler.errors.CompilerError`,
and become rejection reasons or a :class:`~streaming.kafka.errors.InvalidRequest`.)

:func:`one_line` is how any error (ours, Kafka's, Spark's, delta-rs's) is
told in one line: in a log line, a report, or a CLI error.
"""

from __future__ import annotations

import re
from typing import Any


class BitrouteError(RuntimeError):
    """An error bitroute raises and explains (the message says what failed and why)."""


class ConfigError(BitrouteError, ValueError):
    """A configuration value is missing, unknown or invalid; the message names the key."""


class PackError(BitrouteError):
    """The executors' environment cannot be packed; the message says why."""


class RetryAbandoned(BitrouteError):
    """A stop was requested while a step waited to be retried (:func:`streaming.retry.retry`;
    the caller decides what that means: a batch left for a re-run, a commit left in the
    journal)."""


class JvmResolutionError(BitrouteError):
    """Maven could not resolve a group of conf/jvm.toml; the message says which and why."""


class RealtimeBuildError(BitrouteError):
    """The realtime jar (the JVM side of ``streaming.mode = "realtime"``) cannot be built:
    the message names the step (cargo, javac) and its error (:mod:`streaming.realtime.jar`)."""


ONE_LINE_MAX = 500
"""The longest :func:`one_line` (characters)."""
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CAUSE = "↳"
_RAISING_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Unavailable|Stopping): ")


def one_line(failure: BaseException | str | None, *, typed: bool = False) -> str:
    """``failure`` as one line of at most :data:`ONE_LINE_MAX` characters, never empty.

    - A Kafka exception: its ``KafkaError``'s text.
    - A Python traceback inside the text (Spark's wrapping of a Python worker's
      failure): its last raising line (``module.SomeError: message``).
    - Else the first line (so not a Spark message's JVM stack trace, SQL echo or plan),
      followed by its causes (delta-rs's and object_store's
      ``↳`` lines) joined with ``": "``; ANSI colours and the ``Debug source:`` tail
      dropped, whitespace collapsed.
    - Nothing to say: the exception's type name (``"no reason given"`` for a blank text).

    ``typed`` puts the exception's type name first (``OSError: disk full``), for logs of
    failures that may be any exception. Messages of the libraries bitroute uses name URLs
    and statuses, never credentials; this adds nothing but what the failure says.
    """
    text = _text(failure)
    text = _ANSI.sub("", text).split("Debug source:")[0]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if any("Traceback (most recent call last)" in line for line in lines):
        raising = [line for line in lines if _RAISING_LINE.match(line)]
        if raising:
            lines = raising[-1:]
    kept: list[str] = []
    for line in lines:
        if kept and not line.startswith(_CAUSE):
            break
        kept.append(line.lstrip(_CAUSE).strip())
    said = " ".join(": ".join(line for line in kept if line).split())
    if typed and isinstance(failure, BaseException):
        said = f"{type(failure).__name__}: {said}" if said else type(failure).__name__
    if not said:
        said = type(failure).__name__ if isinstance(failure, BaseException) else "no reason given"
    return said[:ONE_LINE_MAX]


def __getattr__(name: str) -> Any:
    if name == "KafkaAccessError":  # its home is streaming.kafka.errors; importable here too
        from streaming.kafka.errors import KafkaAccessError

        return KafkaAccessError
    raise AttributeError(f"module 'streaming.errors' has no attribute {name!r}")


def _text(failure: BaseException | str | None) -> str:
    if failure is None:
        return ""
    if isinstance(failure, str):
        return failure
    first = failure.args[0] if failure.args else None
    if first is not None and callable(getattr(first, "str", None)) and callable(getattr(first, "code", None)):
        return first.str()  # a confluent_kafka KafkaException's KafkaError
    return str(failure)
