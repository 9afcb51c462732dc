"""The state folder's exceptions (:mod:`streaming.state`), all under
:class:`streaming.errors.BitrouteError`; the modules that raise them re-export them."""

from __future__ import annotations

from streaming.errors import BitrouteError


class RouterLockedError(BitrouteError):
    """Another process holds the router lock; the message names it."""


class LeaseHeldError(RouterLockedError):
    """Another router holds the lease of this publishes topic and warehouse; the message
    names it. A :class:`RouterLockedError`: the router was refused, like a held lock."""


class LeaseLostError(RouterLockedError):
    """This router's lease was taken over (or could not be renewed): it must stop routing."""


class OffsetLogError(BitrouteError):
    """An offset log entry is not one of Spark's (the message names the file and why)."""
