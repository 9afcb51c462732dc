"""The audit's exceptions (:mod:`streaming.audit`), all under
:class:`streaming.errors.BitrouteError`; the modules that raise them re-export them."""

from __future__ import annotations

from streaming.errors import BitrouteError


class StorageError(BitrouteError):
    """The warehouse cannot be used as configured: a missing credential, an endpoint that
    is refused or unreachable, a server without conditional writes. One line, no secret."""


class AuditError(BitrouteError):
    """An audit query cannot run: the table or the version is missing, or unreadable."""


class InvalidQuery(AuditError):
    """The query's arguments are wrong (a filter that does not apply to the table, a bad time)."""


class MigrationError(BitrouteError):
    """A table cannot be migrated (unreadable, or of a layout this version does not know)."""


class SqlError(BitrouteError):
    """A statement could not run: an audit table is missing, or Spark failed."""


class InvalidStatement(SqlError):
    """Spark rejected the statement itself (syntax, unknown column or table...)."""


class AuditStopping(BitrouteError):
    """A stop was requested while the audit stage waited for room in the journal."""


class Conflict(BitrouteError):
    """A warehouse object changed since it was read: a compare-and-swap lost
    (:mod:`streaming.audit.warehouse_objects`); read again."""
