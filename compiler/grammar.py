"""The grammar module of each dialect, behind one lookup.

Both :mod:`compiler.amqp` and :mod:`compiler.mqtt` provide the same names:
``SEPARATOR``, ``ONE``, ``MANY``, ``DOLLAR_RULE``, ``SHARE_PREFIX`` (the
prefix of a shared subscription's filter, ``None`` in AMQP),
``parse_filter(text)`` and ``parse_topic(topic)``.

The matching kernel (``bitroute_kernel``) is handed the rules it applies
from here (:func:`kernel_grammar`) rather than keeping copies of them.
"""

from __future__ import annotations

from types import ModuleType
from typing import NamedTuple

from . import amqp, mqtt
from .dialect import Dialect

_GRAMMARS: dict[Dialect, ModuleType] = {Dialect.AMQP: amqp, Dialect.MQTT: mqtt}


def grammar_for(dialect: Dialect) -> ModuleType:
    """The grammar module of ``dialect``."""
    return _GRAMMARS[Dialect(dialect)]


def parse_dialect(value: object) -> Dialect:
    """A :class:`Dialect` from itself or its name (``"amqp"``/``"mqtt"``); ``ValueError`` otherwise."""
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        return Dialect(value)
    except ValueError:
        choices = ", ".join(d.value for d in Dialect)
        raise ValueError(f"unknown dialect {value!r}: expected one of {choices}") from None


class KernelGrammar(NamedTuple):
    """The rules of a dialect's grammar the kernel is handed
    (``bitroute_kernel.Kernel`` per exchange, ``offline_match``): the
    dialect's name (the kernel's own topic rules) and its shared-subscription
    prefix (:data:`compiler.mqtt.SHARE_PREFIX`, ``None`` in AMQP)."""

    dialect: str
    share_prefix: str | None


def kernel_grammar(dialect: Dialect) -> KernelGrammar:
    """The :class:`KernelGrammar` of ``dialect``."""
    dialect = Dialect(dialect)
    return KernelGrammar(dialect.value, grammar_for(dialect).SHARE_PREFIX)
