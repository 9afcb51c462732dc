"""The audit verbs: ``audit`` (a table's rows; ``audit maintain``, ``audit migrate``)
and ``sql`` (Spark SQL over the tables)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from streaming.cli.arguments import config_of
from streaming.cli.errors import CommandError, UsageError, reported
from streaming.cli.output import print_lines
from streaming.cli.times import parse_time
from streaming.config import Config


def audit(args: argparse.Namespace) -> int:
    from streaming.audit import queries as audit
    from streaming.cli.render import TableText, json_lines

    if args.table == "migrate":
        return _audit_migrate(args)
    cfg = config_of(args)
    if args.table == "maintain":
        return _maintain(cfg, args)
    if args.maintain_table is not None:
        raise UsageError("--table goes with 'audit maintain' only")
    with reported(audit.InvalidQuery, audit.AuditError):
        query = audit.AuditQuery(
            table=args.table, subscriber=args.subscriber, message_id=args.message_id,
            since=None if args.since is None else parse_time(args.since, "--since"),
            until=None if args.until is None else parse_time(args.until, "--until"),
            as_of_version=args.as_of_version, state=args.state,
            replayed=args.replayed, retained=args.retained)
        answer = audit.read(cfg, query, args.limit)
        # Each batch is written (and flushed) as it is read: the first rows show at once.
        text = None if args.json else TableText(answer.columns)
        try:
            for batch in answer.batches:
                _write(json_lines(batch) if text is None else text.lines(batch))
            if text is not None:
                _write(text.end())
        except BrokenPipeError:  # `| head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _write(data: bytes) -> None:
    """Write ``data`` to stdout and flush it."""
    out = getattr(sys.stdout, "buffer", None)
    if out is None:  # a text-only stdout (a test's capture)
        sys.stdout.write(data.decode())
        sys.stdout.flush()
        return
    sys.stdout.flush()
    out.write(data)
    out.flush()


def _audit_migrate(args: argparse.Namespace) -> int:
    from streaming.audit import migration as audit_migration
    from streaming.state.lock import RouterLockedError

    given = [f"--{name.replace('_', '-')}" for name in
             ("subscriber", "message_id", "since", "until", "as_of_version", "state", "limit")
             if getattr(args, name) not in (None, False)]
    if given:
        raise UsageError(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply "
                         "to audit migrate")
    cfg = config_of(args)

    def progress(line: str) -> None:
        print(f"bitroute: {line}", file=sys.stderr, flush=True)

    try:
        done = audit_migration.migrate(cfg, progress)
    except RouterLockedError as exc:
        raise CommandError(f"cannot migrate the audit tables while a router runs: {exc}") from None
    except audit_migration.MigrationError as exc:
        raise CommandError(str(exc)) from None
    for table in done:
        if args.json:
            print(json.dumps({"table": table.table, "path": table.path, "result": table.result,
                              "rows": table.rows, "version": table.version}))
        else:
            rows = f" ({table.rows:,} rows, Delta version {table.version})" \
                if table.result == "migrated" else ""
            print(f"{table.table}: {table.result}{rows}")
    return 0


def _maintain(cfg: Config, args: argparse.Namespace) -> int:
    """``bitroute audit maintain``: one maintenance pass, progress on stderr, the summary on
    stdout; exit 1 when a table's pass failed."""
    from streaming.audit import maintenance as audit_maintenance
    from streaming.cli.render import maintenance_lines

    def progress(table: str, step: str, detail: str) -> None:
        if detail != "start":
            print(f"bitroute: {table}: {step}: {detail}", file=sys.stderr, flush=True)

    tables = [args.maintain_table] if args.maintain_table else None
    report = audit_maintenance.maintain(cfg, tables=tables, progress=progress)
    if args.json:
        print(json.dumps(report.to_json(), ensure_ascii=False))
    else:
        print("\n".join(maintenance_lines(report)))
    if not report.ok:
        print(f"bitroute: error: audit maintenance failed: {report.error}", file=sys.stderr)
        return 1
    return 0


def sql(args: argparse.Namespace) -> int:
    from streaming.audit import sql
    from streaming.cli.render import table

    cfg = config_of(args)
    print("bitroute: starting Spark with Delta Lake (takes seconds; `bitroute audit` answers "
          "quick look-ups without it)", file=sys.stderr, flush=True)
    with reported(sql.InvalidStatement, sql.SqlError):
        columns, rows = sql.run(cfg, args.statement)
    if args.json:
        print_lines(json.dumps(row, ensure_ascii=False) for row in rows)
    else:
        print("\n".join(table(columns, rows)))
    return 0
