"""The command line's errors: how a verb says it failed, and the library's errors turned
into them. :func:`streaming.cli.main.main` prints each as one line,
``bitroute: error: ...``, and exits 2 for :class:`UsageError`, 1 for
:class:`CommandError`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING

from streaming.errors import BitrouteError

if TYPE_CHECKING:
    from streaming.kafka.settings import ClientSettings


class CommandError(BitrouteError):
    """A verb failed in a way the user can act on; printed as one line, exit status 1."""


class UsageError(CommandError):
    """A verb's arguments are invalid (nothing was done); printed as one line, exit status 2."""


@contextmanager
def reported(invalid: type[Exception], failed: type[Exception],
             kafka: ClientSettings | None = None) -> Iterator[None]:
    """Turn a module's errors into one-line command errors (invalid: 2, failed: 1).

    With ``kafka`` (the verb's connection, ``config.kafka.client_settings``) the block is
    a Kafka edge (:func:`streaming.kafka.clients.edge`): a Kafka failure that escapes it
    is one line naming its cause (authentication, authorization, the cluster
    unreachable, a missing topic; docs/security.md, "When a command cannot use Kafka"),
    exit status 1, and a cluster it cannot reach fails it within seconds.
    """
    edge: AbstractContextManager[None] = nullcontext()
    failures: tuple[type[Exception], ...] = (failed,)
    if kafka is not None:
        from streaming.kafka.clients import edge as kafka_edge
        from streaming.kafka.errors import ClientError

        edge, failures = kafka_edge(kafka), (failed, ClientError)
    try:
        with edge:
            yield
    except invalid as exc:
        raise UsageError(str(exc)) from None
    except failures as exc:
        raise CommandError(str(exc)) from None
