"""The grammar module of each dialect, behind one lookup.

Both :mod:`compiler.amqp` and :mod:`compiler.mqtt` provide the same names:
``SEPARATOR``, ``ONE``, ``MANY``, ``DOLLAR_RULE``, ``parse_filter(text)`` and
``parse_topic(topic)``; :mod:`compiler.mqtt` adds ``SHARE_PREFIX`` and
``match_part(text)`` for shared subscriptions.
"""

from __future__ import annotations

from types import ModuleType

from . import amqp, mqtt
from .dialect import Dialect

_GRAMMARS: dict[Dialect, ModuleType] = {Dialect.AMQP: amqp, Dialect.MQTT: mqtt}


def grammar_for(dialect: Dialect) -> ModuleType:
    """The grammar module of ``dialect``."""
    return _GRAMMARS[Dialect(dialect)]


def parse_dialect(value: object) -> Dialect:
    """A :class:`Dialect` from itself or its name (``"amqp"``/``"mqtt"``); ``ValueError`` otherwise."""
    try:
        return Dialect(value)
    except ValueError:
        choices = ", ".join(d.value for d in Dialect)
        raise ValueError(f"unknown dialect {value!r}: expected one of {choices}") from None
