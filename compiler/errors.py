"""The compiler's exceptions: one root, one subclass per kind of bad input.

Every message names the offending input and what is wrong with it, e.g.
``"'#' must be the last level: 'a/#/b'"``. Long inputs are shortened in
messages (see :func:`quote`) so that a rejection reason stays one short line.
"""

from __future__ import annotations

MAX_QUOTED_CHARS = 120
"""Inputs longer than this are truncated when quoted in an error message."""


def quote(value: object) -> str:
    """Return ``repr(value)``, shortened to about :data:`MAX_QUOTED_CHARS`."""
    text = repr(value)
    if len(text) <= MAX_QUOTED_CHARS:
        return text
    return f"{text[:MAX_QUOTED_CHARS]}...({len(str(value))} chars)"


class CompilerError(Exception):
    """Root of every error raised by :mod:`compiler` for bad input."""


class FilterError(CompilerError):
    """A topic filter (binding key) is invalid in its exchange's dialect."""


class TopicError(CompilerError):
    """A routing key / topic name is invalid, or names no known exchange."""


class HeaderCriteriaError(CompilerError):
    """A subscription's header criteria are malformed."""


class HeaderError(CompilerError):
    """A message's headers are malformed (not name/value entries, a non-string name)."""


class SubscriptionError(CompilerError):
    """A subscription record is malformed: bad JSON, a missing or mistyped
    field, an invalid subscriber name, or an unknown exchange."""


class UnknownExchangeError(SubscriptionError, TopicError):
    """An exchange name that the index was not configured with.

    It is both a :class:`SubscriptionError` (a subscription naming it is a bad
    record) and a :class:`TopicError` (a publish naming it cannot be routed),
    so callers can catch whichever fits the input they are handling.
    """


class SnapshotFormatError(CompilerError):
    """Snapshot bytes are corrupt, foreign, or of an unsupported format version."""


class InputFileError(CompilerError):
    """An input file of ``bitroute match`` (:mod:`compiler.offline`) cannot be
    read or is not JSON Lines; nothing was matched."""
