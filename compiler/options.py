"""MQTT subscription options: Retain Handling, Retain As Published, No Local (MQTT 5.0, 3.8.3.1).

A subscription of an MQTT exchange may carry, in its changelog value
(:data:`schemas.records.SUBSCRIPTION_OPTION_FIELDS`, each optional):

- ``retain_handling``: the integer 0, 1 or 2 (default 0). When the router
  applies the subscription, the retained messages its filter matches are
  delivered: 0, on every upsert (a new id, or one written again, even with the
  same definition); 1, only when the id did not exist before; 2, never.
- ``retain_as_published``: ``true`` or ``false`` (default false). With it, a live
  delivery of a retained publish keeps the publish's ``retain: true`` header;
  without it the live delivery carries no ``retain`` header, as MQTT 5.0 requires
  of a server. A retained message delivered when a subscription is applied
  always carries it.
- ``no_local``: ``true`` or ``false`` (default false). With it, a publish whose last
  :data:`schemas.records.PUBLISHER_HEADER` names the subscription's subscriber is
  not delivered through it (``bitroute publish --publisher NAME``). MQTT 5.0 makes
  No Local on a shared subscription a protocol error: refused on ``$share/``.

On an exchange that is not MQTT a value other than the default is invalid (the
router rejects the record, the CLI refuses it): these are MQTT's options.

In the index and a snapshot the options are one uint32 of flags per
subscription (:attr:`SubscriptionOptions.flags`), kept only for the
subscriptions whose options are not the default: bits 0-1 Retain Handling, bit
2 Retain As Published, bit 3 No Local.
"""

from __future__ import annotations

from typing import NamedTuple

from schemas.records import NO_LOCAL_FIELD, RETAIN_AS_PUBLISHED_FIELD, RETAIN_HANDLING_FIELD

from .errors import SubscriptionError, quote
from .mqtt import SHARE_PREFIX

RETAIN_HANDLING_ALWAYS = 0
"""Send the retained messages at every subscribe (MQTT 5.0, 3.8.3.1; the default)."""
RETAIN_HANDLING_IF_NEW = 1
"""Send them only if the subscription (its id) did not exist before."""
RETAIN_HANDLING_NEVER = 2
"""Never send them at subscribe."""
RETAIN_HANDLING_VALUES = (RETAIN_HANDLING_ALWAYS, RETAIN_HANDLING_IF_NEW, RETAIN_HANDLING_NEVER)
_RETAIN_HANDLING_MASK = 0b11
_RETAIN_AS_PUBLISHED_BIT = 0b100
_NO_LOCAL_BIT = 0b1000


class SubscriptionOptions(NamedTuple):
    """The MQTT subscription options of one subscription (module docstring)."""

    retain_handling: int = 0
    retain_as_published: bool = False
    no_local: bool = False

    @property
    def flags(self) -> int:
        """The options as the index and a snapshot keep them (0: the default)."""
        return (self.retain_handling | (_RETAIN_AS_PUBLISHED_BIT if self.retain_as_published else 0)
                | (_NO_LOCAL_BIT if self.no_local else 0))

    @classmethod
    def from_flags(cls, flags: int) -> SubscriptionOptions:
        flags = int(flags)
        if not flags:
            return DEFAULT_OPTIONS
        return cls(flags & _RETAIN_HANDLING_MASK, bool(flags & _RETAIN_AS_PUBLISHED_BIT),
                   bool(flags & _NO_LOCAL_BIT))

    @property
    def is_default(self) -> bool:
        return self.flags == 0

    def to_json(self) -> dict[str, object]:
        """The changelog fields of the options that are not the default."""
        out: dict[str, object] = {}
        if self.retain_handling:
            out[RETAIN_HANDLING_FIELD] = self.retain_handling
        if self.retain_as_published:
            out[RETAIN_AS_PUBLISHED_FIELD] = True
        if self.no_local:
            out[NO_LOCAL_FIELD] = True
        return out

    @classmethod
    def from_json(cls, obj: dict) -> SubscriptionOptions:
        """The options of a changelog value (a JSON object); raises
        :class:`SubscriptionError` naming the field for a bad one (null is the default)."""
        handling = obj.get(RETAIN_HANDLING_FIELD)
        if handling is None:
            handling = 0
        elif type(handling) is not int or handling not in RETAIN_HANDLING_VALUES:
            raise SubscriptionError(f"field {RETAIN_HANDLING_FIELD!r} must be 0, 1 or 2, "
                                    f"not {quote(handling)}")
        published, local = _boolean(obj, RETAIN_AS_PUBLISHED_FIELD), _boolean(obj, NO_LOCAL_FIELD)
        if not (handling or published or local):
            return DEFAULT_OPTIONS  # the one default object: RoutingIndex.upsert's fast path
        return cls(handling, published, local)

    def check(self, sub_id: str, exchange: str, dialect: str, filter_: str) -> None:
        """Raise :class:`SubscriptionError` when options other than the default are given
        to a subscription of an exchange that is not MQTT, or No Local to a shared one."""
        if (self.no_local and dialect == "mqtt" and type(filter_) is str
                and filter_.startswith(SHARE_PREFIX)):
            raise SubscriptionError(f"subscription {quote(sub_id)}: {NO_LOCAL_FIELD} on a shared "
                                    "subscription is a protocol error in MQTT 5.0 (3.8.3.1)")
        if dialect != "mqtt" and not self.is_default:
            fields = ", ".join(self.to_json())
            raise SubscriptionError(f"subscription {quote(sub_id)}: {fields}: MQTT subscription "
                                    f"options, and exchange {quote(exchange)} is {dialect} "
                                    "(exchanges.dialects)")


DEFAULT_OPTIONS = SubscriptionOptions()


def _boolean(obj: dict, field: str) -> bool:
    value = obj.get(field)
    if value is None:
        return False
    if type(value) is not bool:
        raise SubscriptionError(f"field {field!r} must be true or false, not {quote(value)}")
    return value
