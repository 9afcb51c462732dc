"""Build ``bitroute-realtime.jar``, the JVM side of realtime mode, from the checkout; once.

The jar holds the classes of ``realtime/src/main/java`` (``io.bitroute.realtime``:
``RouteUdf``, ``RoutingView``, ``NativeRouter``, ...) and the kernel's JNI library at
``native/linux-x86_64/libbitroute_jni.so`` (``NativeRouter`` loads it from there). The
driver hands it to Spark with ``spark.jars``, beside the Kafka connector's jars
(:func:`streaming.jvm.jars` ``("spark")``), and executors of a cluster get it from there.

:func:`realtime_jar` builds it on first use, in three steps:

1. ``cargo build --release`` of the JNI crate (``kernel/jni``);
2. ``javac --release 17`` of the Java sources against pyspark's jars and the Kafka
   connector group's (kafka-clients): nothing downloaded, no Maven;
3. a zip of both, written to ``<cache>/realtime/<digest>/bitroute-realtime.jar``
   (``<cache>``: :func:`streaming.jvm.cache_root`).

``<digest>`` hashes every input: the Java sources, the Rust sources and manifests of the
kernel's ``core`` and ``jni`` crates and its workspace ``Cargo.toml``/``Cargo.lock``, and the
classpath's jar names (pyspark's and kafka-clients' versions). An edit of any of them
builds a new jar in a new folder; an unchanged checkout finds the jar and returns at once.
Concurrent callers (``make test`` while ``make run`` builds) serialise on a lock file.

``BITROUTE_REALTIME_JNI_LIBRARY=<path to a libbitroute_jni.so>`` replaces step 1 with a
library built elsewhere (a cross build for another machine; its bytes join the digest).

Linux x86-64 only: the jar carries one library, and the resource path names the platform.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import conf
from streaming import jvm
from streaming.errors import RealtimeBuildError

JAR_NAME = "bitroute-realtime.jar"
LIBRARY_ENTRY = "native/linux-x86_64/libbitroute_jni.so"
"""Where the JNI library goes in the jar (``NativeRouter.LIBRARY_RESOURCE``, without the
leading ``/``)."""
LIBRARY_VARIABLE = "BITROUTE_REALTIME_JNI_LIBRARY"
JAVA_RELEASE = "17"

_JAVA_SOURCES = Path("realtime/src/main/java")
_JNI_MANIFEST = Path("kernel/jni/Cargo.toml")
_RUST_INPUTS = (Path("kernel/core"), Path("kernel/jni"))
_RUST_WORKSPACE_FILES = (Path("kernel/Cargo.toml"), Path("kernel/Cargo.lock"))
_RUST_SUFFIXES = {".rs", ".toml", ".lock"}


def checkout() -> Path:
    """The repository the jar is built from (the folder with ``realtime/`` and ``kernel/``)."""
    root = conf.path("jvm.toml").parent.parent
    if not (root / _JAVA_SOURCES).is_dir():
        raise RealtimeBuildError("realtime mode builds its jar from a bitroute checkout "
                                 f"(realtime/ and kernel/ sources); {root} is not one")
    return root


def realtime_jar() -> Path:
    """The path of ``bitroute-realtime.jar`` for this checkout's sources, building it first
    when they changed or it was never built (a line on stderr says so; cargo's first build
    takes minutes, later ones seconds). Raises :class:`RealtimeBuildError` naming the step."""
    root = checkout()
    library = os.environ.get(LIBRARY_VARIABLE) or None
    digest = _digest(root, library)
    folder = jvm.cache_root() / "realtime" / digest
    jar = folder / JAR_NAME
    if jar.is_file():
        return jar
    folder.parent.mkdir(parents=True, exist_ok=True)
    with (folder.parent / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not jar.is_file():
            print(f"bitroute: building {JAR_NAME} (cargo, javac) into {folder}: its sources "
                  "changed or it was never built...", file=sys.stderr, flush=True)
            _build(root, Path(library) if library else None, folder)
    return jar


def _build(root: Path, library: Path | None, folder: Path) -> None:
    if library is None:
        library = _cargo_build(root)
    elif not library.is_file():
        raise RealtimeBuildError(f"{LIBRARY_VARIABLE}={library}: no such file")
    with tempfile.TemporaryDirectory(prefix="bitroute-realtime-") as work:
        classes = Path(work) / "classes"
        _javac(root, classes)
        staged = folder.with_name(folder.name + ".partial")
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir(parents=True)
        _pack(classes, library, staged / JAR_NAME)
        shutil.rmtree(folder, ignore_errors=True)
        staged.rename(folder)  # the jar appears whole or not at all


def _cargo_build(root: Path) -> Path:
    """Build the JNI crate; the path of the library cargo reports."""
    manifest = root / _JNI_MANIFEST
    if not manifest.is_file():
        raise RealtimeBuildError(f"the kernel's JNI crate is missing: no {manifest}")
    if shutil.which("cargo") is None:
        raise RealtimeBuildError("cargo is not on PATH (make prereqs installs it)")
    result = subprocess.run(
        ["cargo", "build", "--release", "--manifest-path", str(manifest),
         "--message-format=json-render-diagnostics"],
        cwd=root, capture_output=True, text=True)
    if result.returncode != 0:
        raise RealtimeBuildError(f"cargo could not build {manifest}: {_tail(result.stderr)}")
    for line in result.stdout.splitlines():
        message = json.loads(line) if line.startswith("{") else {}
        for name in message.get("filenames", ()) if message.get("reason") == "compiler-artifact" else ():
            if name.endswith("/libbitroute_jni.so"):
                return Path(name)
    raise RealtimeBuildError(f"cargo built {manifest} but reported no libbitroute_jni.so "
                             "(the crate's [lib] must be a cdylib named bitroute_jni)")


def _javac(root: Path, classes: Path) -> None:
    javac = shutil.which("javac")
    if javac is None:
        raise RealtimeBuildError("javac is not on PATH (a JDK 17: apt-get install openjdk-17-jdk-headless)")
    sources = sorted(str(p) for p in (root / _JAVA_SOURCES).rglob("*.java"))
    if not sources:
        raise RealtimeBuildError(f"no Java sources under {root / _JAVA_SOURCES}")
    command = [javac, "--release", JAVA_RELEASE, "-encoding", "UTF-8", "-Xlint:all,-path",
               "-d", str(classes), "-cp", _classpath(), *sources]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RealtimeBuildError(f"javac failed: {_tail(result.stderr)}")


def _classpath() -> str:
    """pyspark's jars (Spark, Scala, Jackson, slf4j) and the Kafka connector group's."""
    return ":".join([str(_pyspark_jars() / "*"), *(str(p) for p in jvm.jars("spark"))])


def _pyspark_jars() -> Path:
    import pyspark  # only for its jars folder; no JVM is started

    return Path(pyspark.__file__).parent / "jars"


def _pack(classes: Path, library: Path, jar: Path) -> None:
    """A jar of ``classes`` and the library at :data:`LIBRARY_ENTRY`, entries in a fixed order."""
    with zipfile.ZipFile(jar, "w", zipfile.ZIP_DEFLATED) as out:
        out.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n"
                     "Created-By: bitroute streaming/realtime/jar.py\r\n\r\n")
        for path in sorted(classes.rglob("*.class")):
            out.write(path, path.relative_to(classes).as_posix())
        out.write(library, LIBRARY_ENTRY)


def _digest(root: Path, library: str | None) -> str:
    """A hash of every input of the jar (module docstring)."""
    files = sorted((root / _JAVA_SOURCES).rglob("*.java"))
    if library is None:
        for folder in _RUST_INPUTS:
            files += sorted(p for p in (root / folder).rglob("*")
                            if p.suffix in _RUST_SUFFIXES and "target" not in p.relative_to(root).parts)
        files += [root / p for p in _RUST_WORKSPACE_FILES if (root / p).is_file()]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    if library is not None:
        digest.update(b"library\0" + Path(library).read_bytes())
    jars = sorted(p.name for p in _pyspark_jars().glob("*.jar")) + [p.name for p in jvm.jars("spark")]
    digest.update("\n".join(jars).encode())
    return digest.hexdigest()[:16]


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
