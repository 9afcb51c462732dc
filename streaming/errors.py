"""The root of every error ``streaming/`` raises on purpose, and the one-line form of any error.

``except BitrouteError`` catches what the router, the client verbs and the
CLI report as one line; anything else is a bug or a library's own failure.
Each package keeps its specific subclasses in its own ``errors`` module
(:mod:`streaming.kafka.errors`, :mod:`streaming.router.errors`,
:mod:`streaming.audit.errors`, :mod:`streaming.ops.errors`), all under
:class:`BitrouteError`; the modules that raise them re-export them.

:func:`one_line` is how any error (ours, Kafka's, Spark's, delta-rs's) is
told in one line: in a log line, a report, or a CLI error.
"""

from __future__ import annotations

import re


class BitrouteError(RuntimeError):
    """An error bitroute raises and explains (the message says what failed and why)."""


class KafkaAccessError(BitrouteError):
    """Kafka refused bitroute's credentials, or refused them an operation: one line naming
    the principal, the resource and what to grant or check (:mod:`streaming.kafka.clients`)."""


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


def _text(failure: BaseException | str | None) -> str:
    if failure is None:
        return ""
    if isinstance(failure, str):
        return failure
    first = failure.args[0] if failure.args else None
    if first is not None and callable(getattr(first, "str", None)) and callable(getattr(first, "code", None)):
        return first.str()  # a confluent_kafka KafkaException's KafkaError
    return str(failure)
