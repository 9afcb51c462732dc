"""Header criteria: the optional second half of a subscription's condition.

A subscription with criteria matches a message when its topic filter matches
AND its criteria hold on the message's headers (OpenAMQ / RabbitMQ headers
exchange semantics):

- a criterion ``name=value`` holds when the message carries header ``name``
  whose value, decoded as UTF-8, equals ``value``;
- a criterion ``name`` (value ``None``) holds when the message carries
  header ``name``, whatever its value (even none, or undecodable bytes);
- ``match="all"`` needs every criterion to hold, ``match="any"`` at least one.
  As in RabbitMQ, ``all`` of no criteria always holds and ``any`` of no
  criteria never does.

Kafka header values are bytes or null. A value that is not valid UTF-8 still
makes its header present but never equals a value criterion. Kafka allows a
header name to repeat: as in Kafka's ``Headers.lastHeader``, the last entry of
a name is the one criteria see.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from .errors import HeaderCriteriaError, quote
from .text import is_utf8_text

MATCH_MODES = ("all", "any")


def decode_header_value(value: str | bytes | bytearray | memoryview | None) -> str | None:
    """A header value as text, or ``None`` when absent or not valid UTF-8."""
    if value is None or isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True, slots=True)
class HeaderCriteria:
    """``match`` is ``"all"`` or ``"any"``; ``criteria`` maps a header name
    to the value it must equal, or to ``None`` for a presence criterion.

    Instances are immutable (``criteria`` is a read-only copy) and hashable.
    """

    match: Literal["all", "any"]
    criteria: Mapping[str, str | None]

    def __post_init__(self) -> None:
        if self.match not in MATCH_MODES:
            raise HeaderCriteriaError(f"header match must be 'all' or 'any', not {quote(self.match)}")
        if not isinstance(self.criteria, Mapping):
            raise HeaderCriteriaError(
                f"header criteria must be a mapping of name to value or null, not {type(self.criteria).__name__}"
            )
        for name, value in self.criteria.items():
            if type(name) is not str or not name or not is_utf8_text(name):
                raise HeaderCriteriaError(f"header criterion name must be a non-empty UTF-8 string: {quote(name)}")
            if value is not None and (type(value) is not str or not is_utf8_text(value)):
                raise HeaderCriteriaError(
                    f"header criterion {quote(name)} must have a UTF-8 string value or null, not {quote(value)}"
                )
        object.__setattr__(self, "criteria", MappingProxyType(dict(self.criteria)))

    def __hash__(self) -> int:
        return hash((self.match, frozenset(self.criteria.items())))

    @classmethod
    def from_json(cls, obj: object) -> HeaderCriteria:
        """Parse the changelog form ``{"match": "all"|"any", "criteria": {name: value-or-null}}``.

        Raises :class:`HeaderCriteriaError` naming what is wrong.
        """
        if not isinstance(obj, dict):
            raise HeaderCriteriaError(f"headers must be an object with 'match' and 'criteria', not {quote(obj)}")
        missing = {"match", "criteria"} - obj.keys()
        if missing:
            raise HeaderCriteriaError(f"headers is missing {', '.join(sorted(missing))}: {quote(obj)}")
        extra = obj.keys() - {"match", "criteria"}
        if extra:
            raise HeaderCriteriaError(f"headers has unknown fields {', '.join(sorted(map(str, extra)))}: {quote(obj)}")
        if not isinstance(obj["criteria"], dict):
            raise HeaderCriteriaError(f"headers.criteria must be an object, not {quote(obj['criteria'])}")
        return cls(obj["match"], obj["criteria"])

    def to_json(self) -> dict[str, object]:
        """The changelog form accepted by :meth:`from_json`."""
        return {"match": self.match, "criteria": dict(self.criteria)}

    def matches(self, headers: Mapping[str, str | bytes | None]) -> bool:
        """Whether the criteria hold on ``headers`` (name to value; bytes are decoded)."""
        if self.match == "all":
            for name, want in self.criteria.items():
                if name not in headers:
                    return False
                if want is not None and decode_header_value(headers[name]) != want:
                    return False
            return True
        for name, want in self.criteria.items():
            if name in headers and (want is None or decode_header_value(headers[name]) == want):
                return True
        return False
