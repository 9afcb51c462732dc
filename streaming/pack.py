"""The executors' Python environment, packed for Spark's ``spark.archives``.

On a cluster every executor runs the matcher in Python workers (``mapInArrow``):
they need bitroute's code, its kernel (``bitroute_kernel``) and its runtime
dependencies. :func:`archive` packs them from the environment the driver runs in
into one ``.tar.gz`` holding a virtual environment (Spark's documented way to
ship Python dependencies with an application): Spark copies it to each executor
and unpacks it as ``./bitroute-env`` in the executor's working folder, whose
``bin/python`` then runs the Python workers (``spark.pyspark.python``).

What is packed: every installed distribution reachable from the requirements of
``bitroute`` and ``bitroute-kernel``, minus the driver-only ones
(:data:`DRIVER_ONLY`: pyspark and py4j come to each Python worker from the
cluster's Spark, ``pyspark.zip`` and ``py4j-*.zip`` on its ``PYTHONPATH``;
delta-spark is the Delta API of driver sessions), without their ``tests/``
folders; and bitroute's own packages as the driver imports them (from a checkout
or site-packages alike, so an editable install ships its working tree). Files
are read from the driver's environment as installed (pip's ``RECORD``): nothing is
downloaded or compiled, and the executors run exactly the driver's versions.

The environment's ``bin/python`` is a symbolic link to the interpreter the
driver's environment was made from (:func:`base_interpreter`, a CPython 3.11):
that path must hold the same Python on every worker (a virtual environment holds
no interpreter, only its packages). Nothing else is needed there.

The archive is cached in ``<cache>/pack/`` (:func:`streaming.jvm.cache_root`),
named by a digest of what goes in it (the interpreter, every distribution's
name, version and ``RECORD``, bitroute's source files): it is rebuilt only when
one of them changes. The three newest archives are kept.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import logging
import os
import re
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from streaming.atomic import write_atomically
from streaming.errors import PackError
from streaming.jvm import cache_root

_log = logging.getLogger(__name__)

ENVIRONMENT = "bitroute-env"
"""The folder the archive unpacks to in each executor's working folder (``#`` fragment)."""
EXECUTOR_PYTHON = f"./{ENVIRONMENT}/bin/python"
"""``spark.pyspark.python`` for the executors: the unpacked environment's interpreter."""
DRIVER_ONLY = frozenset({"pyspark", "py4j", "delta-spark"})
"""Distributions the executors never import from the archive (see module docstring)."""
PACKAGES = ("compiler", "streaming", "schemas", "conf")
"""bitroute's own top-level packages."""
KEEP = 3
"""Archives kept in the cache (the newest): a running router may still serve an older one."""
_FORMAT = "1"  # bumped when the archive's layout changes, so old archives are not reused


@dataclass(frozen=True)
class Packed:
    """A packed environment: ``path`` for ``spark.archives``, and what it cost."""

    path: Path
    size_bytes: int
    distributions: int
    built: bool
    """False when the cached archive was reused."""
    seconds: float
    """Time to build it (or to find it in the cache)."""
    worker_python: str
    """The interpreter every worker must have at this path (:func:`base_interpreter`)."""

    def spark_settings(self) -> dict[str, str]:
        """The settings that make executors use it (the driver keeps its own interpreter)."""
        return {
            "spark.archives": f"{self.path}#{ENVIRONMENT}",
            "spark.pyspark.python": EXECUTOR_PYTHON,
            "spark.pyspark.driver.python": sys.executable,
        }

    def to_json(self) -> dict[str, object]:
        return {
            "archive": str(self.path), "size_bytes": self.size_bytes,
            "distributions": self.distributions, "built": self.built,
            "seconds": round(self.seconds, 2), "worker_python": self.worker_python,
            "python_version": _python_version(), "spark": self.spark_settings(),
        }


def base_interpreter() -> str:
    """The real path of the CPython the driver's environment was made from."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def archive(folder: Path | None = None) -> Packed:
    """Return the packed environment of this Python, building it if the cache lacks it.

    Progress goes to the ``streaming.pack`` logger (stderr under the command line).
    Concurrent callers serialise on a lock file; one builds, the others reuse.
    """
    started = time.monotonic()
    folder = folder or cache_root() / "pack"
    distributions = _distributions()
    sources = _package_files()
    digest = _digest(distributions, sources)
    path = folder / f"{ENVIRONMENT}-{digest}.tar.gz"
    built = False
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.is_file():
                _build(path, distributions, sources)
                built = True
                _prune(folder, keep=path)
    return Packed(path=path, size_bytes=path.stat().st_size, distributions=len(distributions),
                  built=built, seconds=time.monotonic() - started,
                  worker_python=base_interpreter())


# --- what goes in -----------------------------------------------------------------

def _name(requirement: str) -> str | None:
    """The distribution a requirement names, or None for an extra's (``; extra == ...``)."""
    name, _, marker = requirement.partition(";")
    if "extra" in marker:
        return None
    found = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", name)
    return _canonical(found.group(1)) if found else None


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _distributions() -> list[metadata.Distribution]:
    """The installed distributions the executors import: the requirement closure of
    bitroute and its kernel, without :data:`DRIVER_ONLY` and bitroute itself.

    A requirement whose distribution is not installed is one whose marker excluded
    it on this platform (the driver would not run otherwise); it is skipped.
    """
    try:
        roots = [_canonical(r) for r in metadata.distribution("bitroute").requires or []]
    except metadata.PackageNotFoundError:
        raise PackError("bitroute is not installed in this Python "
                        f"({sys.executable}): pip install /path/to/bitroute") from None
    pending = ["bitroute-kernel", *filter(None, (_name(r) for r in roots))]
    found: dict[str, metadata.Distribution] = {}
    while pending:
        name = pending.pop()
        if name in found or name in DRIVER_ONLY or name == "bitroute":
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            if name == "bitroute-kernel":
                raise PackError("the kernel (bitroute-kernel) is not installed in this Python: "
                                "pip install /path/to/bitroute") from None
            continue
        if dist.metadata["Name"] is None:  # a distribution pip is installing or removing
            raise PackError(f"the installed distribution {name} has no metadata "
                            "(half installed?); pip install it again")
        found[name] = dist
        pending.extend(filter(None, (_name(r) for r in dist.requires or [])))
    return [found[name] for name in sorted(found)]


def _label(dist: metadata.Distribution) -> str:
    return f"{dist.metadata['Name']}=={dist.version}"


def _dist_files(dist: metadata.Distribution) -> Iterator[tuple[Path, str]]:
    """(file, path in site-packages) of an installed distribution, by its RECORD.

    Files outside site-packages (console scripts in ``bin/``) are left out: the
    workers run no scripts. So are ``tests/`` folders, which nothing imports.
    """
    root = Path(str(dist.locate_file(""))).resolve()
    for entry in dist.files or ():
        relative = Path(os.path.normpath(entry))
        if relative.parts[0] == ".." or "tests" in relative.parts:
            continue
        path = root / relative
        if path.is_file():
            yield path, relative.as_posix()


def _package_files() -> list[tuple[Path, str]]:
    """bitroute's own source files, from where this Python imports them."""
    import importlib

    files = []
    for package in PACKAGES:
        init = importlib.import_module(package).__file__
        if init is None:
            raise PackError(f"{package} is not a regular package (no __init__.py)")
        root = Path(init).parent
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                files.append((path, f"{package}/{path.relative_to(root).as_posix()}"))
    return files


def _digest(distributions: list[metadata.Distribution], sources: list[tuple[Path, str]]) -> str:
    digest = hashlib.sha256(f"{_FORMAT}\n{base_interpreter()}\n{sys.version}\n".encode())
    for dist in distributions:
        digest.update(f"{_label(dist)}\n".encode())
        digest.update((dist.read_text("RECORD") or "").encode())
    for path, name in sources:
        digest.update(f"{name}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _python_version() -> str:
    return ".".join(str(n) for n in sys.version_info[:3])


# --- building ---------------------------------------------------------------------

def _build(path: Path, distributions: list[metadata.Distribution],
           sources: list[tuple[Path, str]]) -> None:
    site = f"lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
    python = base_interpreter()
    _log.info(f"packing the executors' environment: bitroute and {len(distributions)} "
              f"distributions (pyspark, py4j, delta-spark left out) into {path}")
    started = time.monotonic()
    count = 0

    def write(handle) -> None:
        nonlocal count
        # gzip level 1: on pyarrow and deltalake (310 MB, most of the archive) level 6
        # saved 11% of the size (107 MB against 120 MB) for 2.7x the CPU (17.9 s
        # against 6.7 s); the build is what a user waits for, a LAN copies 13 MB in well
        # under a second.
        with tarfile.open(fileobj=handle, mode="w:gz", compresslevel=1) as tar:
            _add_text(tar, "pyvenv.cfg", f"home = {os.path.dirname(python)}\n"
                                         "include-system-site-packages = false\n"
                                         f"version = {_python_version()}\n")
            for link in ("python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}"):
                _add_link(tar, f"bin/{link}", python)
            for dist in distributions:
                for file, name in _dist_files(dist):
                    tar.add(file, arcname=f"{site}/{name}", recursive=False, filter=_plain)
                    count += 1
                _log.info(f"  {_label(dist)} ({time.monotonic() - started:.0f} s)")
            for file, name in sources:
                tar.add(file, arcname=f"{site}/{name}", recursive=False, filter=_plain)
            _log.info(f"  bitroute: {len(sources)} files of {', '.join(PACKAGES)}")

    write_atomically(path, write)
    _log.info(f"packed {count + len(sources)} files, {path.stat().st_size / 1e6:.0f} MB, "
              f"in {time.monotonic() - started:.1f} s")


def _plain(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Owner-neutral entries, as any user unpacks them."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _add_text(tar: tarfile.TarFile, name: str, text: str) -> None:
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
    tar.addfile(info, io.BytesIO(data))


def _add_link(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, int(time.time())
    tar.addfile(info)


def _prune(folder: Path, keep: Path) -> None:
    archives = sorted(folder.glob(f"{ENVIRONMENT}-*.tar.gz"), key=lambda p: p.stat().st_mtime,
                      reverse=True)
    for old in [a for a in archives if a != keep][KEEP - 1:]:
        old.unlink(missing_ok=True)


def describe(packed: Packed, emit: Callable[[str], None]) -> None:
    """The summary of ``bitroute pack``: the archive and what a worker needs."""
    emit(f"{packed.path}")
    emit(f"  {packed.size_bytes / 1e6:.0f} MB, bitroute and {packed.distributions} distributions, "
         + (f"built in {packed.seconds:.1f} s" if packed.built else "reused from the cache"))
    emit(f"  workers need: Java 17 and Python {_python_version()} at {packed.worker_python}")
    emit("  executors use it through: " + " ".join(
        f"{key}={value}" for key, value in packed.spark_settings().items()))
