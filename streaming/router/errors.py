"""The router's exceptions (:mod:`streaming.router`), all under
:class:`streaming.errors.BitrouteError`; the modules that raise them re-export them."""

from __future__ import annotations

from compiler import SubscriptionError
from streaming.errors import BitrouteError


class RouterStopping(BitrouteError):
    """A stop was requested while a batch was waiting to retry: the batch is left for a re-run."""


class DeliveryUnavailable(BitrouteError):
    """Kafka could not take the records for a reason that is not about them; retry the batch."""


class SnapshotStoreError(BitrouteError):
    """The store is missing something a re-run needs, or holds an unreadable file."""


class ChangelogError(BitrouteError):
    """A changelog catch-up failed: the changelog could not be read, or what it
    read could not be written where it goes (the rejected topic)."""


class RetentionGapError(BitrouteError):
    """Publishes were lost to retention and ``streaming.on_retention_gap`` is ``stop``: the
    message names the gap and the command that acknowledges it."""


class PublishesTopicRecreated(BitrouteError):
    """The publishes topic was deleted and created again under the router: the query stops
    and the router follows the new incarnation (the message names both topic ids)."""


class RouterModeError(BitrouteError):
    """The state folder was routed in a mode this start cannot follow (its message says
    which, and what to do)."""


class LimitError(SubscriptionError, BitrouteError):
    """A subscription breaks a limit of ``[limits]``; the message names the limit's key and
    value. A :class:`compiler.SubscriptionError`: a changelog record that breaks one is
    rejected with that reason, as any invalid subscription is."""
