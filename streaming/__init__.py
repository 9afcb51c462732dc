"""bitroute's runtime: the router, its state, its verbs.

Importing the package sets one process-wide default before any module loads
delta-rs: the ``deltalake`` wheel carries its own jemalloc (symbols prefixed
``_rjem_``, configured by ``_RJEM_MALLOC_CONF``), which by default keeps the
pages it freed for 10 s and then only marks them lazily free (``MADV_FREE``),
so the resident memory of a process that commits to Delta every batch keeps
the high-water mark of every commit's transient allocations.
:data:`DELTA_MALLOC_CONF` returns freed pages to the OS after a second
(docs/architecture.md, "Memory over time"). A value already in the environment
(an operator's, or an empty one for jemalloc's defaults) is left as it is.
"""

import os

DELTA_MALLOC_CONF = "dirty_decay_ms:1000,muzzy_decay_ms:0"
"""jemalloc options of delta-rs in bitroute's processes (module docstring)."""

os.environ.setdefault("_RJEM_MALLOC_CONF", DELTA_MALLOC_CONF)
