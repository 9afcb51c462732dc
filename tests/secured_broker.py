"""A secured Kafka broker for tests: the embedded broker's jars, TLS, SASL and an authorizer.

One KRaft node on loopback with five listeners:

- ``SECURE`` (SASL_SSL): PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512;
- ``SASLPLAIN`` (SASL_PLAINTEXT): the same mechanisms and users, no TLS;
- ``MTLS`` (SSL, client certificates required): the broker's own inter-broker
  listener too, and a client's mTLS listener;
- ``TLS`` (SSL, ``ssl.client.auth=none``): a client needs only the CA file; its
  principal is ``User:ANONYMOUS`` (no certificate to name it), so what it may do
  is what the ACLs grant ``User:ANONYMOUS``;
- ``CONTROLLER`` (SSL, client certificates required).

``StandardAuthorizer`` is on with ``super.users`` = the ``admin`` SCRAM user and
the broker's certificate; nobody else may do anything without an ACL. SCRAM
credentials are created at format time (``kafka-storage format --add-scram``),
PLAIN users in the listener's JAAS line. The certificates (a CA, the broker's,
a client's) are made with openssl in the broker's folder.
"""

from __future__ import annotations

import base64
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

import conf
from short_jvm import short_jvm_env
from streaming import jvm, kafka
from streaming.kafka.broker import SINGLE_NODE_SETTINGS, free_port
from streaming.kafka.settings import ClientSettings

SCRAM_USERS = {  # name: (mechanism, password)
    "admin": ("SCRAM-SHA-512", "admin-pw-9f3c"),
    "router": ("SCRAM-SHA-512", "router-pw-7d1e"),
    "alice": ("SCRAM-SHA-256", "alice-pw-4b2a"),
    "bob": ("SCRAM-SHA-512", "bob-pw-c8e5"),
}
PLAIN_USERS = {"pat": "pat-pw-61f0"}
CLIENT_CERT_CN = "carol"
START_TIMEOUT_S = 120.0


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(folder: Path, name: str = "ca") -> Path:
    """A self-signed CA, ``<name>.pem`` and ``<name>.key`` in ``folder``; returns the PEM."""
    folder.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
             f"{name}.pem", "-days", "2", "-subj", f"/CN=bitroute-test-{name}", cwd=folder)
    return folder / f"{name}.pem"


def make_certificates(folder: Path) -> None:
    """ca.pem/ca.key, broker.pem/broker.key (SAN 127.0.0.1, localhost), carol.pem/carol.key."""
    make_ca(folder)
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, ext in (("broker", ["-extfile", "san.ext"]), (CLIENT_CERT_CN, [])):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                 f"{name}.csr", "-subj", f"/CN={name}", cwd=folder)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", *ext, cwd=folder)
    # The broker's PEM key store: its private key (PKCS#8) and certificate in one file.
    (folder / "broker.keystore.pem").write_text((folder / "broker.key").read_text()
                                                + (folder / "broker.pem").read_text())


@dataclass
class SecuredBroker:
    folder: Path
    host: str = "127.0.0.1"
    secure_port: int = field(default_factory=free_port)
    sasl_plaintext_port: int = field(default_factory=free_port)
    mtls_port: int = field(default_factory=free_port)
    tls_port: int = field(default_factory=free_port)
    controller_port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def certs(self) -> Path:
        return self.folder / "certs"

    @property
    def sasl_bootstrap(self) -> str:
        return f"{self.host}:{self.secure_port}"

    @property
    def sasl_plaintext_bootstrap(self) -> str:
        return f"{self.host}:{self.sasl_plaintext_port}"

    @property
    def mtls_bootstrap(self) -> str:
        return f"{self.host}:{self.mtls_port}"

    @property
    def tls_bootstrap(self) -> str:
        return f"{self.host}:{self.tls_port}"

    def sasl_properties(self, user: str, tls: bool = True) -> dict[str, str]:
        """``[kafka.client]`` for ``user`` (its own mechanism) on the SASL_SSL listener, or
        with ``tls=False`` on the SASL_PLAINTEXT one."""
        if user in PLAIN_USERS:
            mechanism, password = "PLAIN", PLAIN_USERS[user]
        else:
            mechanism, password = SCRAM_USERS[user]
        props = {"security.protocol": "SASL_SSL" if tls else "SASL_PLAINTEXT",
                 "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password}
        if tls:
            props["ssl.ca.location"] = str(self.certs / "ca.pem")
        return props

    def tls_properties(self, ca: Path | None = None) -> dict[str, str]:
        """``[kafka.client]`` for the TLS listener: the CA file only (``ca``, else the right one)."""
        return {"security.protocol": "SSL", "ssl.ca.location": str(ca or self.certs / "ca.pem")}

    def mtls_properties(self) -> dict[str, str]:
        return {"security.protocol": "SSL", "ssl.ca.location": str(self.certs / "ca.pem"),
                "ssl.certificate.location": str(self.certs / f"{CLIENT_CERT_CN}.pem"),
                "ssl.key.location": str(self.certs / f"{CLIENT_CERT_CN}.key")}

    def settings(self, user: str) -> ClientSettings:
        return ClientSettings.of(self.sasl_bootstrap, self.sasl_properties(user))

    def start(self) -> None:
        make_certificates(self.certs)
        properties = self.folder / "server.properties"
        properties.write_text(self._properties())
        classpath = jvm.classpath("kafka_broker")
        cluster_id = "-"
        while cluster_id.startswith("-"):
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        scram = [arg for name, (mechanism, password) in SCRAM_USERS.items()
                 for arg in ("--add-scram", f"{mechanism}=[name={name},password={password}]")]
        subprocess.run(["java", "-Xmx256m", "-cp", classpath, "kafka.tools.StorageTool", "format",
                        "-t", cluster_id, "-c", str(properties), *scram],
                       check=True, capture_output=True, text=True, timeout=180, env=short_jvm_env())
        log = (self.folder / "broker.log").open("ab")
        self.process = subprocess.Popen(
            ["java", "-Xms256m", "-Xmx768m",
             f"-Dlog4j2.configurationFile={conf.path('broker-log4j2.xml')}",
             "-cp", classpath, "kafka.Kafka", str(properties)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env=short_jvm_env())  # it lives one test module: short_jvm's options
        admin = kafka.admin(self.settings("admin"))
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the secured broker exited; see {self.folder / 'broker.log'}")
            try:
                admin.list_topics(timeout=2)
                return
            except KafkaException:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the secured broker did not answer; see "
                                       f"{self.folder / 'broker.log'}") from None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def grant(self, principal: str, resource: str, name: str, operations: list[str],
              prefixed: bool = False) -> None:
        """Allow ``principal`` the ACL ``operations`` on a topic, group or the cluster."""
        admin = kafka.admin(self.settings("admin"))
        kind = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP,
                "cluster": ResourceType.BROKER}[resource]
        pattern = ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL
        bindings = [AclBinding(kind, name, pattern, principal, "*", AclOperation[op.upper()],
                               AclPermissionType.ALLOW) for op in operations]
        for future in admin.create_acls(bindings).values():
            future.result(30)

    def revoke(self, principal: str, resource: str, name: str) -> None:
        """Remove every ACL of ``principal`` on a literal topic or group ``name``."""
        admin = kafka.admin(self.settings("admin"))
        kind = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP}[resource]
        # Host None matches any (librdkafka's filter); confluent-kafka's stub says str only.
        refusal = AclBindingFilter(kind, name, ResourcePatternType.LITERAL, principal, None,  # type: ignore[arg-type]
                                   AclOperation.ANY, AclPermissionType.ANY)
        for future in admin.delete_acls([refusal]).values():
            future.result(30)

    def _properties(self) -> str:
        certs = self.certs
        plain_users = " ".join(f'user_{u}="{p}"' for u, p in PLAIN_USERS.items())
        listeners = [("SECURE", self.secure_port), ("SASLPLAIN", self.sasl_plaintext_port),
                     ("MTLS", self.mtls_port), ("TLS", self.tls_port),
                     ("CONTROLLER", self.controller_port)]
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{self.host}:{self.controller_port}",
            "listeners": ",".join(f"{name}://{self.host}:{port}" for name, port in listeners),
            "advertised.listeners": ",".join(f"{name}://{self.host}:{port}"
                                             for name, port in listeners if name != "CONTROLLER"),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "MTLS",
            "listener.security.protocol.map": ("CONTROLLER:SSL,SECURE:SASL_SSL,"
                                               "SASLPLAIN:SASL_PLAINTEXT,MTLS:SSL,TLS:SSL"),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(certs / "broker.keystore.pem"),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(certs / "ca.pem"),
            "listener.name.mtls.ssl.client.auth": "required",
            "listener.name.controller.ssl.client.auth": "required",
            "listener.name.tls.ssl.client.auth": "none",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        }
        for listener in ("secure", "saslplain"):  # the same mechanisms and users on both
            settings |= {
                f"listener.name.{listener}.plain.sasl.jaas.config":
                    f"org.apache.kafka.common.security.plain.PlainLoginModule required "
                    f"{plain_users};",
                f"listener.name.{listener}.scram-sha-256.sasl.jaas.config":
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;",
                f"listener.name.{listener}.scram-sha-512.sasl.jaas.config":
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            }
        settings |= {
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:admin;User:CN=broker",
            "log.dirs": str(self.folder / "logs"),
            **SINGLE_NODE_SETTINGS,
            "auto.create.topics.enable": "false",
        }
        return "".join(f"{k}={v}\n" for k, v in settings.items())
