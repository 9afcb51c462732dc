"""JVM options for the JVMs a test starts that live seconds, not the session.

:data:`SHORT_JVM`: the C1 compiler alone and the serial collector, what bitroute
already gives a cluster's driver (streaming.session). A quarter off a router's
start at toy size (open 17.4 s -> 13.0 s, docs/benchmarks.md), the code paths
unchanged: a JIT tier and a collector, not a setting of bitroute's. Every JVM a
test starts as a child gets them (``bitroute run``, ``bitroute sql``, a user's
pyspark session, a standalone cluster and its executors); the session's broker
and SparkSession, which live the whole run, do not.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

SHORT_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def short_jvm_options(environ: Mapping[str, str] = os.environ) -> str:
    """``JAVA_TOOL_OPTIONS`` with :data:`SHORT_JVM` after whatever ``environ`` has (once)."""
    present = environ.get("JAVA_TOOL_OPTIONS")
    if present and SHORT_JVM in present:
        return present
    return " ".join(o for o in (present, SHORT_JVM) if o)


def short_jvm_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """A copy of ``environ`` for a child process whose JVMs live seconds to minutes:
    ``JAVA_TOOL_OPTIONS`` with :data:`SHORT_JVM` (:func:`short_jvm_options`)."""
    return {**environ, "JAVA_TOOL_OPTIONS": short_jvm_options(environ)}
