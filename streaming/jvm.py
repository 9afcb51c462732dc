"""Resolve the JVM artifacts of ``conf/jvm.toml`` from Maven Central, once.

Each group (``spark``, ``kafka_broker``, ``delta``) is resolved with the machine's Maven
client into ``<cache>/jars/<group>-<hash of its coordinates>/``; a
``complete`` marker written last makes a later run reuse the folder without
calling Maven. Changing a coordinate changes the hash, so stale jars are never
mixed with new ones. Concurrent callers (``make test`` while ``make run``
resolves) serialise on a lock file.

The cache lives in ``.cache/`` at the repository root when bitroute runs from a
checkout, else in ``~/.cache/bitroute``.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import shutil
import subprocess
import tomllib
from pathlib import Path

import conf
from streaming.errors import JvmResolutionError

_log = logging.getLogger(__name__)

GROUPS = ("spark", "kafka_broker", "delta")
_MARKER = "complete"


def cache_root() -> Path:
    """Where resolved jars are kept (see module docstring)."""
    checkout = conf.path("jvm.toml").parent.parent
    if (checkout / "pyproject.toml").is_file():
        return checkout / ".cache"
    return Path.home() / ".cache" / "bitroute"


def coordinates(group: str) -> dict:
    """The ``[group]`` table of conf/jvm.toml."""
    with conf.path("jvm.toml").open("rb") as handle:
        table = tomllib.load(handle)
    if group not in table:
        raise JvmResolutionError(f"conf/jvm.toml has no [{group}] group")
    return table[group]


def jars(group: str) -> list[Path]:
    """Return the jar paths of ``group``, resolving them with Maven on first use."""
    spec = coordinates(group)
    artifacts = list(spec["artifacts"])
    digest = hashlib.sha256("\n".join(artifacts).encode()).hexdigest()[:12]
    folder = cache_root() / "jars" / f"{group}-{digest}"
    if not (folder / _MARKER).is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        with (folder.parent / f".{group}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (folder / _MARKER).is_file():
                _resolve(group, artifacts, folder)
                if spec.get("skip_pyspark_provided", False):
                    _drop_pyspark_provided(folder)
                (folder / _MARKER).write_text("\n".join(artifacts) + "\n")
    return sorted(folder.glob("*.jar"))


def classpath(group: str) -> str:
    """``jars(group)`` joined for ``java -cp``."""
    return ":".join(str(p) for p in jars(group))


def _resolve(group: str, artifacts: list[str], folder: Path) -> None:
    if shutil.which("mvn") is None:
        raise JvmResolutionError("Maven ('mvn') is not on PATH; install it (apt-get install maven)")
    _log.info(f"resolving {len(artifacts)} JVM artifact(s) for '{group}' from Maven Central "
              f"into {folder} (first run only)...")
    shutil.rmtree(folder, ignore_errors=True)
    work = folder.with_name(folder.name + ".pom")
    work.mkdir(parents=True, exist_ok=True)
    (work / "pom.xml").write_text(_pom(group, artifacts))
    command = [
        "mvn", "-B", "-q", "-s", str(conf.path("maven-settings.xml")),
        "-f", str(work / "pom.xml"),
        "dependency:copy-dependencies", "-DincludeScope=runtime",
        f"-DoutputDirectory={folder}",
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        errors = [line for line in result.stdout.splitlines() if "[ERROR]" in line]
        detail = errors[0] if errors else result.stderr.strip()[-500:]
        raise JvmResolutionError(f"Maven could not resolve the '{group}' jars: {detail}")
    shutil.rmtree(work, ignore_errors=True)


def _pom(group: str, artifacts: list[str]) -> str:
    # Imported here: xml.sax pulls in urllib and http (15 ms), which every
    # other verb, `bitroute match` first, would pay at start-up.
    from xml.sax.saxutils import escape

    deps = []
    for coordinate in artifacts:
        parts = coordinate.split(":")
        if len(parts) != 3:
            raise JvmResolutionError(f"conf/jvm.toml [{group}]: expected group:artifact:version, "
                                     f"got {coordinate!r}")
        g, a, v = (escape(p) for p in parts)
        deps.append(f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
                    f"<version>{v}</version></dependency>")
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        f"<groupId>bitroute.jvm</groupId><artifactId>{group.replace('_', '-')}</artifactId>"
        "<version>1</version><packaging>pom</packaging>"
        f"<dependencies>{''.join(deps)}</dependencies></project>\n"
    )


def _artifact_name(jar: Path) -> str:
    """``scala-library-2.13.16.jar`` -> ``scala-library`` (the name before the version)."""
    stem = jar.stem
    pieces = stem.split("-")
    for i, piece in enumerate(pieces):
        if piece[:1].isdigit():
            return "-".join(pieces[:i])
    return stem


def _drop_pyspark_provided(folder: Path) -> None:
    import pyspark  # only for its jars folder; no JVM is started

    provided = {_artifact_name(j) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    for jar in folder.glob("*.jar"):
        if _artifact_name(jar) in provided:
            jar.unlink()
