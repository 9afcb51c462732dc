"""How bitroute connects to Kafka: bootstrap servers plus the ``[kafka.client]`` properties.

``[kafka.client]`` (conf/bitroute.toml) holds librdkafka property names,
applied to every client bitroute makes. :func:`resolve_properties` checks
them at start: a key outside :data:`SUPPORTED` (or a value outside its
choices) is refused with the key named; a value ``env:NAME`` is read from the
environment and ``file:PATH`` from a file (its text, one trailing newline
dropped), so a password need not be written in the file.

:class:`ClientSettings` is the result, hashable and picklable (the Python
workers' producer cache is keyed by it). It renders the properties two ways:

- :meth:`ClientSettings.librdkafka`: the librdkafka configuration (every
  Python client: driver, workers, CLI verbs);
- :meth:`ClientSettings.spark_options`: the Spark Kafka source's ``kafka.*``
  options, in the Java client's names (``sasl.jaas.config`` for PLAIN and
  SCRAM, PEM trust and key stores).

Invariant: no secret (:data:`SECRET_KEYS`, the JAAS line, a private key) ever
appears in a ``repr``, ``str`` or :meth:`ClientSettings.describe`; Spark's
plan descriptions are kept clean by :data:`SPARK_REDACTION_REGEX`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from streaming.kafka.errors import ClientSettingsError

PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL = "PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SUPPORTED: dict[str, tuple[str, ...] | None] = {
    "security.protocol": (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL),
    "sasl.mechanism": MECHANISMS,
    "sasl.username": None,
    "sasl.password": None,
    "ssl.ca.location": None,
    "ssl.certificate.location": None,
    "ssl.key.location": None,
    "ssl.key.password": None,
    "ssl.endpoint.identification.algorithm": ("https", "none"),
    "client.id": None,
}
"""The ``[kafka.client]`` keys bitroute supports and tests, with their allowed values (None: any)."""
SECRET_KEYS = frozenset({"sasl.password", "ssl.key.password"})
_FILES = ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location")
_ALIASES = {"sasl.mechanisms": "sasl.mechanism"}  # librdkafka's older name
_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
SPARK_REDACTION_REGEX = (r"(?i)secret|password|token|access[.]?key|jaas|keystore[.]key"
                         r"|sasl[.]|ssl[.]key")
"""``spark.redaction.regex``: Spark's default plus the Kafka source's secret options
(``kafka.sasl.jaas.config``, ``kafka.ssl.keystore.key``, ``kafka.ssl.key.password``):
their values are shown as ``*********(redacted)`` in the UI, logs and plan descriptions."""
REDACTED = "*****"


def resolve_properties(raw: Mapping[str, object], environ: Mapping[str, str] | None = None,
                       prefix: str = "kafka.client.") -> dict[str, str]:
    """The checked, resolved properties of a raw ``[kafka.client]`` table.

    Raises :class:`ClientSettingsError` whose message starts with the key
    (``kafka.client.sasl.password: environment variable X is not set``) and
    never contains a secret value.
    """
    env = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for name, value in raw.items():
        key = _ALIASES.get(name, name)
        where = prefix + name
        if key not in SUPPORTED:
            raise ClientSettingsError(
                f"{where}: unknown or unsupported Kafka client property (supported: "
                f"{', '.join(SUPPORTED)})")
        if not isinstance(value, str) or not value:
            raise ClientSettingsError(f"{where}: expected a non-empty string")
        value = _resolve(where, value, env)
        choices = SUPPORTED[key]
        if choices is not None:
            match = [c for c in choices if c.lower() == value.lower()]
            if not match:
                shown = REDACTED if key in SECRET_KEYS else repr(value)
                raise ClientSettingsError(f"{where}: expected one of {', '.join(choices)}, "
                                          f"got {shown}")
            value = match[0]
        out[key] = value
    _check_consistent(out, prefix)
    return out


def _resolve(where: str, value: str, env: Mapping[str, str]) -> str:
    if value.startswith("env:"):
        name = value[4:]
        if not name or name not in env or not env[name]:
            raise ClientSettingsError(f"{where}: environment variable {name or '?'} is not set")
        return env[name]
    if value.startswith("file:"):
        path = Path(value[5:]).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ClientSettingsError(f"{where}: cannot read {path}: "
                                      f"{getattr(exc, 'strerror', None) or type(exc).__name__}"
                                      ) from None
        text = text[:-1] if text.endswith("\n") else text
        if not text:
            raise ClientSettingsError(f"{where}: {path} is empty")
        return text
    return value


def _check_consistent(props: dict[str, str], prefix: str) -> None:
    protocol = props.setdefault("security.protocol", PLAINTEXT)
    sasl = protocol in (SASL_PLAINTEXT, SASL_SSL)
    tls = protocol in (SSL, SASL_SSL)
    for key in props:
        if key.startswith("sasl.") and not sasl:
            raise ClientSettingsError(f"{prefix}{key}: applies only with security.protocol "
                                      f"SASL_PLAINTEXT or SASL_SSL (it is {protocol})")
        if key.startswith("ssl.") and not tls:
            raise ClientSettingsError(f"{prefix}{key}: applies only with security.protocol "
                                      f"SSL or SASL_SSL (it is {protocol})")
    if sasl:
        for key in ("sasl.mechanism", "sasl.username", "sasl.password"):
            if key not in props:
                raise ClientSettingsError(f"{prefix}{key}: required with security.protocol "
                                          f"{protocol}")
    if ("ssl.certificate.location" in props) != ("ssl.key.location" in props):
        missing = "ssl.key.location" if "ssl.key.location" not in props else "ssl.certificate.location"
        raise ClientSettingsError(f"{prefix}{missing}: a client certificate needs both "
                                  "ssl.certificate.location and ssl.key.location")
    for key in _FILES:
        if key in props and not Path(props[key]).is_file():
            raise ClientSettingsError(f"{prefix}{key}: no such file: {props[key]}")
    if "ssl.key.location" in props:
        head = Path(props["ssl.key.location"]).read_text(errors="replace")[:64]
        if "BEGIN PRIVATE KEY" not in head and "BEGIN ENCRYPTED PRIVATE KEY" not in head:
            raise ClientSettingsError(
                f"{prefix}ssl.key.location: expected a PEM PKCS#8 private key (BEGIN PRIVATE KEY "
                "or BEGIN ENCRYPTED PRIVATE KEY; the Spark Kafka source reads no other form): "
                "convert it with openssl pkcs8 -topk8")


@dataclass(frozen=True)
class ClientSettings:
    """Where Kafka is and how to connect to it; what every client factory takes.

    ``properties`` are resolved ``[kafka.client]`` properties (sorted pairs,
    so the object is hashable). ``repr`` shows them with secrets replaced.
    """

    bootstrap: str
    properties: tuple[tuple[str, str], ...] = field(default=())

    @classmethod
    def of(cls, bootstrap: str, properties: Mapping[str, str] | None = None) -> ClientSettings:
        props = dict(properties or {})
        if props.get("security.protocol", PLAINTEXT) == PLAINTEXT:
            props.pop("security.protocol", None)
        return cls(bootstrap, tuple(sorted(props.items())))

    @classmethod
    def coerce(cls, where: str | ClientSettings) -> ClientSettings:
        """``where`` as settings: a bare ``host:port[,...]`` string is a plaintext connection."""
        return where if isinstance(where, ClientSettings) else cls.of(where)

    def __repr__(self) -> str:
        return f"ClientSettings({self.bootstrap!r}, {self.describe()})"

    __str__ = __repr__

    @property
    def props(self) -> dict[str, str]:
        return dict(self.properties)

    @property
    def protocol(self) -> str:
        return self.props.get("security.protocol", PLAINTEXT)

    def describe(self) -> str:
        """The settings for people, secrets replaced: ``SASL_SSL, SCRAM-SHA-512 as router``."""
        props = self.props
        parts = [self.protocol]
        if "sasl.mechanism" in props:
            parts.append(f"{props['sasl.mechanism']} as {props.get('sasl.username', '?')}")
        if "ssl.certificate.location" in props:
            parts.append(f"client certificate {props['ssl.certificate.location']}")
        return ", ".join(parts)

    def principal(self) -> str:
        """The Kafka principal these settings authenticate as, as an ACL names it
        (``User:router``; a TLS client certificate's subject; ``User:ANONYMOUS``)."""
        props = self.props
        if "sasl.username" in props:
            return f"User:{props['sasl.username']}"
        if "ssl.certificate.location" in props:
            return f"User:{_certificate_subject(props['ssl.certificate.location'])}"
        return "User:ANONYMOUS"

    def librdkafka(self) -> dict[str, str]:
        """librdkafka configuration: ``bootstrap.servers`` and the properties."""
        return {"bootstrap.servers": self.bootstrap, **self.props}

    def spark_options(self) -> dict[str, str]:
        """The Spark Kafka source's ``kafka.*`` options for the same connection (Java names)."""
        props = self.props
        options = {"kafka.bootstrap.servers": self.bootstrap}
        protocol = self.protocol
        if protocol != PLAINTEXT:
            options["kafka.security.protocol"] = protocol
        if "sasl.mechanism" in props:
            mechanism = props["sasl.mechanism"]
            options["kafka.sasl.mechanism"] = mechanism
            options["kafka.sasl.jaas.config"] = (
                f'{_JAAS_MODULES[mechanism]} required username="{_jaas(props["sasl.username"])}" '
                f'password="{_jaas(props["sasl.password"])}";')
        if "ssl.ca.location" in props:
            options["kafka.ssl.truststore.type"] = "PEM"
            options["kafka.ssl.truststore.location"] = props["ssl.ca.location"]
        if "ssl.certificate.location" in props:
            options["kafka.ssl.keystore.type"] = "PEM"
            options["kafka.ssl.keystore.certificate.chain"] = Path(
                props["ssl.certificate.location"]).read_text()
            options["kafka.ssl.keystore.key"] = Path(props["ssl.key.location"]).read_text()
            if "ssl.key.password" in props:
                options["kafka.ssl.key.password"] = props["ssl.key.password"]
        if props.get("ssl.endpoint.identification.algorithm") == "none":
            options["kafka.ssl.endpoint.identification.algorithm"] = ""
        return options

    def secrets(self) -> list[str]:
        """Every secret value these settings hold (for tests and redaction checks)."""
        props = self.props
        found = [props[k] for k in SECRET_KEYS if k in props]
        if "ssl.key.location" in props:
            found.append(Path(props["ssl.key.location"]).read_text())
        return found


def _jaas(value: str) -> str:
    """A JAAS quoted-string body: Kafka's parser (a StreamTokenizer) unescapes backslashes."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _certificate_subject(path: str) -> str:
    """The subject of a PEM certificate in RFC 2253 form (Kafka's default TLS principal)."""
    import subprocess

    try:
        out = subprocess.run(["openssl", "x509", "-in", path, "-noout", "-subject", "-nameopt",
                              "RFC2253"], capture_output=True, text=True, timeout=5, check=True)
        return out.stdout.strip().removeprefix("subject=").strip()
    except (OSError, subprocess.SubprocessError):
        return f"<the subject of {path}>"
