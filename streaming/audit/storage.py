"""Where the audit tables' files live: the warehouse, and how every process reaches it.

``delta.warehouse`` is a local folder or an object-store URI. This module is the
one place that turns it into what each client needs, from the same environment:

- :func:`storage_options`: the ``storage_options`` of every delta-rs call
  (``DeltaTable(uri, storage_options=...)``, ``write_deltalake``), the router's
  committer and maintenance, ``bitroute audit``, ``audit maintain``, ``audit
  migrate``, ``status``;
- :func:`warehouse_filesystem`: the pyarrow filesystem for files written
  outside delta-rs (the routing tasks' audit files, committed later by the driver);
- :func:`object_store`: an obstore store under the warehouse, for the objects
  that need conditional writes (the router lease, :mod:`streaming.state.lease`;
  the commit-safety probe, :func:`check_commit_safety`);
- :func:`spark_settings`: the S3A settings of a Spark session that reads the
  tables (``bitroute sql``).

Object stores: ``s3://`` (and ``s3a://``, the same bucket) is supported and
tested against an S3-compatible server. Its settings come from the
environment only, never from bitroute's configuration, and are never printed
or written: ``AWS_ACCESS_KEY_ID`` + ``AWS_SECRET_ACCESS_KEY`` (+
``AWS_SESSION_TOKEN``), or a web identity (``AWS_WEB_IDENTITY_TOKEN_FILE`` +
``AWS_ROLE_ARN``) or container credentials
(``AWS_CONTAINER_CREDENTIALS_RELATIVE_URI``/``FULL_URI``); ``AWS_REGION`` (or
``AWS_DEFAULT_REGION``); ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` for an
S3-compatible server; ``AWS_ALLOW_HTTP=true`` to allow an ``http://``
endpoint (credentials then travel unencrypted: loopback tests only). A
missing credential or an ``http://`` endpoint without ``AWS_ALLOW_HTTP`` is
a :class:`StorageError` before anything is contacted. Other schemes
(``gs://``, ``az://``, ``abfss://``) are handed to delta-rs and obstore as they
are (each reads its own environment); they are not tested here.

Commits on S3: delta-rs 1.6 commits a table version by writing its log
entry with a conditional put (``If-None-Match: *``), so concurrent delta-rs
writers are safe exactly when the server honours that header (AWS S3 does
since 2024; not every S3-compatible server does). :func:`check_commit_safety`
proves it once per process on the warehouse's own bucket; a server that
ignores it is refused unless ``delta.allow_unsafe_commits`` is set.
Delta-Spark 4.4 writes S3 log entries without that header
(``S3SingleDriverLogStore``), so a Spark writer is not safe beside the router:
docs/running.md, "Storage".
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, cast
from urllib.parse import urlparse

from streaming.audit.errors import StorageError
from streaming.config import DeltaConfig
from streaming.errors import one_line

if TYPE_CHECKING:
    from obstore.store import S3Config
    from pyarrow import fs

S3_SCHEMES = ("s3", "s3a")
REDACTED = "***"
_SECRET_KEYS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
_TRUE = ("1", "true", "yes", "on")
PROBE_PREFIX = "_bitroute/commit-probe"
"""Where :func:`check_commit_safety` writes its probe objects (deleted after)."""

_checked: set[str] = set()
_checked_lock = threading.Lock()


class StorageOptions(dict):
    """delta-rs storage options: a dict whose ``repr`` hides the secret values."""

    def __repr__(self) -> str:
        return repr({k: REDACTED if k in _SECRET_KEYS else v for k, v in self.items()})

    __str__ = __repr__


def scheme(warehouse: str) -> str:
    """The warehouse URI's scheme, ``""`` for a local path."""
    if "://" not in warehouse:
        return ""
    return urlparse(warehouse).scheme.lower()


def is_object_store(delta: DeltaConfig) -> bool:
    return scheme(delta.warehouse) not in ("", "file")


def storage_options(delta: DeltaConfig, environ: Mapping[str, str] | None = None
                    ) -> StorageOptions:
    """The options every delta-rs call on ``delta.warehouse`` takes (module docstring):
    empty for a local path; for ``s3://``, the AWS settings of the environment. Raises
    :class:`StorageError` for a missing credential or an ``http://`` endpoint without
    ``AWS_ALLOW_HTTP``."""
    if scheme(delta.warehouse) not in S3_SCHEMES:
        return StorageOptions()
    env = os.environ if environ is None else environ
    where = f"delta.warehouse {delta.warehouse}"
    options = StorageOptions()
    static = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if all(static):
        options["AWS_ACCESS_KEY_ID"], options["AWS_SECRET_ACCESS_KEY"] = static
        if env.get("AWS_SESSION_TOKEN"):
            options["AWS_SESSION_TOKEN"] = env["AWS_SESSION_TOKEN"]
    elif any(static):
        missing = "AWS_SECRET_ACCESS_KEY" if static[0] else "AWS_ACCESS_KEY_ID"
        raise StorageError(f"{where}: {missing} is not set (AWS_ACCESS_KEY_ID and "
                           "AWS_SECRET_ACCESS_KEY go together)")
    elif not (env.get("AWS_WEB_IDENTITY_TOKEN_FILE") and env.get("AWS_ROLE_ARN")) and not (
            env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
            or env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI")):
        raise StorageError(f"{where}: no S3 credentials in the environment: set "
                           "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
                           "AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN)")
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        options["AWS_REGION"] = region
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    allow_http = env.get("AWS_ALLOW_HTTP", "").strip().lower() in _TRUE
    if endpoint:
        parsed = urlparse(endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise StorageError(f"{where}: AWS_ENDPOINT_URL {endpoint!r} is not an http(s) URL")
        if parsed.scheme == "http" and not allow_http:
            raise StorageError(f"{where}: the endpoint {endpoint} is plain http: set "
                               "AWS_ALLOW_HTTP=true to allow it (credentials travel "
                               "unencrypted)")
        options["AWS_ENDPOINT_URL"] = endpoint.rstrip("/")
    if allow_http:
        options["AWS_ALLOW_HTTP"] = "true"
    if env.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST"):
        options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = env["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"]
    return options


def warehouse_filesystem(delta: DeltaConfig) -> tuple[fs.FileSystem, str]:
    """The pyarrow filesystem holding ``delta.warehouse`` and the warehouse's path inside
    it (no trailing slash). A plain path is the local filesystem (made absolute); ``s3://``
    is an ``S3FileSystem`` with :func:`storage_options`' credentials, region and endpoint."""
    from pyarrow import fs

    kind = scheme(delta.warehouse)
    if kind in S3_SCHEMES:
        options = storage_options(delta)
        endpoint = options.get("AWS_ENDPOINT_URL")
        parsed = urlparse(endpoint) if endpoint else None
        filesystem = fs.S3FileSystem(
            access_key=options.get("AWS_ACCESS_KEY_ID"),
            secret_key=options.get("AWS_SECRET_ACCESS_KEY"),
            session_token=options.get("AWS_SESSION_TOKEN"),
            region=options.get("AWS_REGION"),
            endpoint_override=parsed.netloc if parsed else None,
            scheme=parsed.scheme if parsed else "https",
            allow_bucket_creation=False, allow_bucket_deletion=False)
        url = urlparse(delta.warehouse)
        return filesystem, f"{url.netloc}{url.path}".rstrip("/")
    filesystem, path = fs.FileSystem.from_uri(_uri(delta.warehouse))
    return filesystem, path.rstrip("/")


def object_store(delta: DeltaConfig, prefix: str):
    """An obstore store rooted at ``<delta.warehouse>/<prefix>`` (an object store only),
    configured like delta-rs (:func:`storage_options`)."""
    return object_store_at(f"{delta.warehouse.rstrip('/')}/{prefix.strip('/')}",
                           storage_options(delta))


def object_store_at(uri: str, options: Mapping[str, str]):
    """An obstore store rooted at object-store ``uri``, with delta-rs's ``options``."""
    from obstore.store import S3Store, from_url

    url = urlparse(uri)
    root = url.path.strip("/")
    if url.scheme.lower() in S3_SCHEMES:
        # delta-rs's keys as obstore names them (_obstore_key), the keys S3Config types.
        config = cast("S3Config", {_obstore_key(k): v for k, v in options.items()})
        return S3Store(url.netloc, prefix=root, config=config,
                       client_options={"connect_timeout": "5s", "timeout": "30s"})
    return from_url(f"{url.scheme}://{url.netloc}/{root}")


def _obstore_key(key: str) -> str:
    # obstore wants object_store's own names (aws_endpoint, not AWS_ENDPOINT_URL)
    name = key.lower()
    return "aws_endpoint" if name == "aws_endpoint_url" else name


def check_commit_safety(delta: DeltaConfig, allow_unsafe: bool | None = None) -> None:
    """Prove, once per process and warehouse, that the object store refuses a second
    create of one object (``If-None-Match: *``), which is what keeps concurrent delta-rs
    commits from overwriting each other; a local folder needs no proof. Raises
    :class:`StorageError` when the server ignores it (unless ``allow_unsafe``, default
    ``delta.allow_unsafe_commits``) or cannot be reached."""
    if not is_object_store(delta) or delta.warehouse in _checked:
        return
    if allow_unsafe is None:
        allow_unsafe = delta.allow_unsafe_commits
    import obstore
    from obstore.exceptions import AlreadyExistsError

    store = object_store(delta, PROBE_PREFIX)
    name = uuid.uuid4().hex
    try:
        obstore.put(store, name, b"1", mode="create")
        try:
            obstore.put(store, name, b"2", mode="create")
            honoured = False
        except AlreadyExistsError:
            honoured = True
        obstore.delete(store, name)
    except Exception as exc:  # noqa: BLE001 (one line, whatever the store's error type)
        raise StorageError(f"delta.warehouse {delta.warehouse}: {one_line(exc)}") from None
    if not honoured and not allow_unsafe:
        raise StorageError(
            f"delta.warehouse {delta.warehouse}: the object store ignores conditional writes "
            "(If-None-Match), so concurrent Delta commits (the router's, its maintenance's, "
            "`bitroute audit maintain`'s) could overwrite each other; use a store that honours "
            "them, or set delta.allow_unsafe_commits = true to accept the risk")
    with _checked_lock:
        _checked.add(delta.warehouse)


def _uri(warehouse: str) -> str:
    if "://" in warehouse:
        return warehouse
    return Path(warehouse).absolute().as_uri()


def spark_settings(delta: DeltaConfig, environ: Mapping[str, str] | None = None
                   ) -> dict[str, str]:
    """The Spark settings that let a session read ``s3://`` tables through S3A, from the
    same environment (empty for other warehouses). No secret: the S3A credentials come
    from the JVM's environment (``EnvironmentVariableCredentialsProvider``)."""
    if scheme(delta.warehouse) not in S3_SCHEMES:
        return {}
    options = storage_options(delta, environ)
    settings = {
        "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        # Hadoop 3.5's default "analytics" stream hung reading a Delta log from an
        # S3-compatible server here (waiting on a block forever); the classic stream reads it.
        "spark.hadoop.fs.s3a.input.stream.type": "classic",
        "spark.hadoop.fs.s3a.aws.credentials.provider":
            "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider",
    }
    if "AWS_REGION" in options:
        settings["spark.hadoop.fs.s3a.endpoint.region"] = options["AWS_REGION"]
    endpoint = options.get("AWS_ENDPOINT_URL")
    if endpoint:
        settings["spark.hadoop.fs.s3a.endpoint"] = endpoint
        settings["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(
            endpoint.startswith("https://")).lower()
        if options.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "").lower() not in _TRUE:
            settings["spark.hadoop.fs.s3a.path.style.access"] = "true"
    return settings
