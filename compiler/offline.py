"""Offline matching of JSON Lines files: the library under ``bitroute match``.

Input contract (the command's front end, :mod:`streaming.cli.match`, states
the rest: stdout, stderr, exit status):

``SUBS.jsonl``: one JSON object a line, ``{"id", "filter", "subscriber"?,
"headers"?: {"match": "all"|"any", "criteria": {name: value-or-null}}}``. The
id is a JSON string or number and is echoed back exactly as given. Without a
``subscriber``, a subscription is its own subscriber (``str(id)``; an id that
is not a valid subscriber name gets a stable surrogate name instead, as the
name only decides shared-subscription choices here). Other fields are ignored.
All subscriptions go into one exchange of the given dialect. A rejected line
yields ``{"id": ..., "error": "reason"}``; the first valid line of an id
wins, later lines with that id are rejected as duplicates.

``TOPICS.jsonl``: one JSON object a line, ``{"topic", "headers"?: {name:
value}, "message_id"?}``; the message id defaults to the line's 0-based line
number in the file, as a string. Per topic line, in input order: ``{"topic":
..., "subscriptions": [matched ids]}`` (numbers first, numerically, then
strings, lexicographically) or ``{"topic": ..., "error": "reason"}``.

Blank lines are skipped. A file that cannot be read or a non-blank line that
is not a JSON object raises :class:`InputFileError` before any output.

Two paths, one result. The *kernel* path (``bitroute_kernel.offline_match``,
Rust) reads, matches and writes the whole pair of files when every line is
one it reads exactly as Python's ``json`` does and none needs a message
(no rejection, no error line, no shared subscription, no header criteria,
ids strings or integers, no line break but ``\\n``). Any other pair goes to
the Python reference path (:mod:`compiler.offline_python`: ``json.loads``,
``RoutingIndex.upsert`` and ``Matcher.match`` per line), which writes the
same lines and the messages. The grammar's rules the kernel needs (the MQTT
shared-subscription prefix, the subscriber-name characters) are handed to it
from :mod:`compiler` (:func:`compiler.grammar.kernel_grammar`,
:data:`compiler.subscription.SUBSCRIBER_RULE`). This module
imports neither numpy nor pyarrow, so the kernel path starts in a few
milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from bitroute_kernel import offline_match

from .errors import InputFileError
from .grammar import kernel_grammar, parse_dialect
from .subscription import SUBSCRIBER_RULE

EXCHANGE = "offline"
"""The one exchange every offline subscription and topic belongs to."""


@dataclass
class OfflineResult:
    """What ``bitroute match`` prints: ``rejections`` (JSON lines, for stderr)
    and :meth:`lines` (the stdout text, in chunks)."""

    rejections: list[str]
    _chunks: Iterator[str] = field(repr=False)

    def lines(self) -> Iterator[str]:
        """The output lines, each ending in ``\\n``, joined into chunks (once)."""
        return self._chunks


def match_files(dialect: str, subscriptions_path: str, topics_path: str) -> OfflineResult:
    """Read both files, index the subscriptions, and return the result (see
    the module docstring). Raises :class:`InputFileError` for an unreadable or
    non-JSON-Lines file and ``ValueError`` for an unknown dialect, both before
    any matching."""
    chosen = parse_dialect(dialect)
    try:
        output = offline_match(
            read_file(subscriptions_path, "subscriptions"),
            read_file(topics_path, "topics"),
            kernel_grammar(chosen),
            SUBSCRIBER_RULE,
        )
    except InputFileError:
        output = None  # the Python path raises it again, in its order
    if output is not None:
        return OfflineResult([], (chunk.decode("ascii") for chunk in output))
    from .offline_python import python_result

    return python_result(chosen, subscriptions_path, topics_path)


def read_file(path: str, what: str) -> bytes:
    """The bytes of a file that must be UTF-8; raises :class:`InputFileError`."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        data.decode("utf-8")  # the reference path reads text: same failure here
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(f"cannot read {what} file {path}: {exc}") from None
    return data
