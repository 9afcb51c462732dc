"""``bitroute match``: the command-line front end of :func:`compiler.offline.match_files`.

Contract::

    bitroute match --dialect amqp|mqtt --subscriptions SUBS.jsonl --topics TOPICS.jsonl

stdout: one JSON object per topic line, in input order (the file formats and
the objects are documented in :mod:`compiler.offline`). stderr: one JSON
object per rejected subscription, ``{"id": ..., "error": "reason"}``.

Exit status 0 when both files were read (rejections included); 2, with a
one-line message on stderr and nothing on stdout, when a file cannot be read,
a non-blank line is not a JSON object, or the dialect is unknown.
"""

from __future__ import annotations

from typing import IO

EXIT_OK = 0
EXIT_BAD_INPUT = 2


def run_match(dialect: str, subscriptions_path: str, topics_path: str, stdout: IO[str], stderr: IO[str]) -> int:
    """Run ``bitroute match`` (see the module docstring); returns the exit status."""
    from compiler.offline import InputFileError, match_files

    try:
        result = match_files(dialect, subscriptions_path, topics_path)
    except (InputFileError, ValueError) as exc:
        stderr.write(f"bitroute match: {exc}\n")
        return EXIT_BAD_INPUT
    for line in result.rejections:
        stderr.write(line + "\n")
    for chunk in result.lines():
        stdout.write(chunk)
    return EXIT_OK
