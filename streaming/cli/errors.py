"""The CLI's exceptions (:mod:`streaming.cli`), under :class:`streaming.errors.BitrouteError`;
:mod:`streaming.cli.main` re-exports them."""

from __future__ import annotations

from streaming.errors import BitrouteError


class CommandError(BitrouteError):
    """A verb failed in a way the user can act on; printed as one line, exit status 1."""


class UsageError(CommandError):
    """A verb's arguments are invalid (nothing was done); printed as one line, exit status 2."""
