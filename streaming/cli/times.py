"""The command line's one time grammar: every ``--since`` and ``--until`` flag
(``subscribe --since``, ``audit --since``/``--until``) reads its value with
:func:`parse_time`.

A time ``T`` is one of:

- an ISO-8601 date or date and time, ``2026-11-26``, ``2026-11-26T17:00:00Z``,
  ``2026-11-26T18:00:00+01:00``, ``2026-11-26 17:00:00.5``: UTC when it names no
  zone (a date alone is its midnight, UTC);
- a duration back from now: a number of days, hours, minutes and seconds in that
  order, each at most once, ``90s``, ``15m``, ``2h``, ``7d``, ``1h30m``, ``1d12h``.

Anything else (``yesterday``, ``2x``, ``1m2h``, the empty string) is refused with
one line naming the flag, the value and these forms (:data:`FORMS`). What a
flag does with the time (``subscribe --since`` refuses one in the future) is
the verb's.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from streaming.cli.errors import UsageError

FORMS = ("an ISO-8601 time (2026-11-26T17:00:00Z, 2026-11-26; UTC when it names no zone) "
         "or a duration back from now (90s, 15m, 2h, 7d, 1h30m)")
"""The accepted forms, as the error line and the flags' help say them."""

_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def parse_time(text: str, flag: str, now: datetime | None = None) -> datetime:
    """``text``, the value of ``flag`` (``--since``), as an aware UTC datetime (module
    docstring); a duration counts back from ``now`` (default: the clock). Raises
    :class:`UsageError` ``<flag> '<text>': expected <FORMS>`` for anything else."""
    stripped = text.strip()
    match = _DURATION.fullmatch(stripped)
    try:
        if stripped and match is not None:
            days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
            now = now or datetime.now(UTC)
            return now.astimezone(UTC) - timedelta(
                days=days, hours=hours, minutes=minutes, seconds=seconds)
        when = datetime.fromisoformat(stripped)
        if when.tzinfo is None:
            return when.replace(tzinfo=UTC)
        return when.astimezone(UTC)
    except (ValueError, OverflowError):  # overflow: 99999999d, 9999-12-31T23:00-05:00
        raise UsageError(f"{flag} {text!r}: expected {FORMS}") from None
