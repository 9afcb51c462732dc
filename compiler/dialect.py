"""The two topic dialects an exchange can speak."""

from __future__ import annotations

from enum import StrEnum


class Dialect(StrEnum):
    """An exchange's dialect: which grammar its filters and topics follow.

    ``AMQP`` is RabbitMQ's topic exchange (words separated by ``.``, ``*`` and
    ``#``); ``MQTT`` is MQTT 3.1.1/5.0 (levels separated by ``/``, ``+`` and
    ``#``, shared subscriptions). See :mod:`compiler.amqp` and
    :mod:`compiler.mqtt` for the grammars.
    """

    AMQP = "amqp"
    MQTT = "mqtt"
