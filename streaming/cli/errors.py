"""The command line's errors: how a verb says it failed, and the library's errors turned
into them. :func:`streaming.cli.main.main` prints each as one line,
``bitroute: error: ...``, and exits 2 for :class:`UsageError`, 1 for
:class:`CommandError`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from streaming.errors import BitrouteError


class CommandError(BitrouteError):
    """A verb failed in a way the user can act on; printed as one line, exit status 1."""


class UsageError(CommandError):
    """A verb's arguments are invalid (nothing was done); printed as one line, exit status 2."""


@contextmanager
def reported(invalid: type[Exception], failed: type[Exception]) -> Iterator[None]:
    """Turn a module's errors into one-line command errors (invalid: 2, failed: 1)."""
    try:
        yield
    except invalid as exc:
        raise UsageError(str(exc)) from None
    except failed as exc:
        raise CommandError(str(exc)) from None
