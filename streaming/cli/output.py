"""How verbs write many lines to stdout: a block at a time, flushed."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from itertools import islice


def print_lines(lines: Iterable[str], block: int = 4096) -> None:
    """Print ``lines`` a block at a time: one write per line is slow on an
    unbuffered stdout (PYTHONUNBUFFERED), and a listing can have millions."""
    lines = iter(lines)
    while chunk := list(islice(lines, block)):
        sys.stdout.write("\n".join(chunk) + "\n")
    sys.stdout.flush()
