"""[kafka.client]: checked and resolved at load, rendered for librdkafka and for Spark,
never showing a secret. Pure logic: no broker."""

from __future__ import annotations

import pytest

from streaming.config import ConfigError, load
from streaming.kafka.settings import ClientSettings

SCRAM = {"kafka.client.security.protocol": "SASL_SSL",
         "kafka.client.sasl.mechanism": "SCRAM-SHA-512",
         "kafka.client.sasl.username": "router",
         "kafka.client.sasl.password": "env:BITROUTE_KAFKA_PASSWORD"}


def _load(overrides: dict, environ: dict | None = None):
    return load(overrides=overrides, environ=environ or {})


def test_env_and_file_values_are_read_at_load_and_never_shown(tmp_path):
    secret_file = tmp_path / "pw"
    secret_file.write_text("from-a-file\n")
    cfg = _load({**SCRAM, "kafka.client.sasl.password": f"file:{secret_file}"})
    assert cfg.kafka.client["sasl.password"] == "from-a-file"
    cfg = _load(SCRAM, {"BITROUTE_KAFKA_PASSWORD": "s3cret-value"})
    settings = cfg.kafka.client_settings
    assert settings.librdkafka()["sasl.password"] == "s3cret-value"
    for shown in (repr(cfg), str(cfg.kafka), repr(settings), settings.describe()):
        assert "s3cret-value" not in shown
    assert settings.principal() == "User:router"


@pytest.mark.parametrize("overrides, environ, message", [
    ({"kafka.client.sasl.pasword": "x"}, {}, "kafka.client.sasl.pasword: unknown or unsupported"),
    ({"kafka.client.sasl.mechanism": "GSSAPI", "kafka.client.security.protocol": "SASL_SSL"}, {},
     "kafka.client.sasl.mechanism: expected one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
    (SCRAM, {}, "kafka.client.sasl.password: environment variable BITROUTE_KAFKA_PASSWORD is not set"),
    ({**SCRAM, "kafka.client.sasl.password": "file:/nonexistent/pw"}, {},
     "kafka.client.sasl.password: cannot read /nonexistent/pw"),
    ({"kafka.client.sasl.username": "u"}, {}, "kafka.client.sasl.username: applies only with"),
    ({"kafka.client.security.protocol": "SSL", "kafka.client.ssl.ca.location": "/no/ca.pem"}, {},
     "kafka.client.ssl.ca.location: no such file"),
    ({"kafka.client.security.protocol": "SASL_PLAINTEXT", "kafka.client.sasl.mechanism": "PLAIN"},
     {}, "kafka.client.sasl.username: required"),
])
def test_bad_client_properties_are_refused_with_the_key_named(overrides, environ, message):
    with pytest.raises(ConfigError) as raised:
        _load(overrides, environ)
    assert str(raised.value).startswith(message), raised.value


def test_the_environment_variable_a_password_names_is_not_taken_for_a_key():
    # BITROUTE_KAFKA_PASSWORD would otherwise read as the unknown key kafka.password.
    cfg = _load(SCRAM, {"BITROUTE_KAFKA_PASSWORD": "pw"})
    assert cfg.kafka.client["sasl.password"] == "pw"
    with pytest.raises(ConfigError, match="kafka.password: unknown"):
        _load({}, {"BITROUTE_KAFKA_PASSWORD": "pw"})


@pytest.mark.parametrize("mechanism, module", [
    ("PLAIN", "org.apache.kafka.common.security.plain.PlainLoginModule"),
    ("SCRAM-SHA-256", "org.apache.kafka.common.security.scram.ScramLoginModule"),
    ("SCRAM-SHA-512", "org.apache.kafka.common.security.scram.ScramLoginModule"),
])
def test_spark_options_carry_the_jaas_line_and_pem_trust(tmp_path, mechanism, module):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    settings = ClientSettings.of("b:9093", {
        "security.protocol": "SASL_SSL", "sasl.mechanism": mechanism, "sasl.username": "u",
        "sasl.password": 'p"w\\', "ssl.ca.location": str(ca)})
    assert settings.spark_options() == {
        "kafka.bootstrap.servers": "b:9093",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": mechanism,
        "kafka.sasl.jaas.config": f'{module} required username="u" password="p\\"w\\\\";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": str(ca),
    }


def test_plaintext_is_the_default_and_adds_nothing():
    settings = _load({}).kafka.client_settings
    assert settings.librdkafka() == {"bootstrap.servers": "127.0.0.1:9092"}
    assert settings.spark_options() == {"kafka.bootstrap.servers": "127.0.0.1:9092"}


@pytest.mark.parametrize("client, spark", [
    *[({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
        "sasl.username": "u", "sasl.password": "env:PW"},
       {"kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": mechanism})
      for mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")],
    ({"security.protocol": "SSL", "ssl.ca.location": "CA"},
     {"kafka.security.protocol": "SSL", "kafka.ssl.truststore.type": "PEM"}),
])
def test_the_tested_combinations_are_accepted(tmp_path, client, spark):
    """SASL_PLAINTEXT with each mechanism (no TLS file), and TLS with only a CA file (no
    client certificate): what tests/streaming/kafka/test_security.py runs against a broker."""
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    client = {k: str(ca) if v == "CA" else v for k, v in client.items()}
    cfg = _load({f"kafka.client.{k}": v for k, v in client.items()}, {"PW": "pw-1"})
    settings = cfg.kafka.client_settings
    assert settings.librdkafka() == {"bootstrap.servers": "127.0.0.1:9092",
                                     **{k: "pw-1" if v == "env:PW" else v
                                        for k, v in client.items()}}
    options = settings.spark_options()
    assert spark.items() <= options.items(), options
    assert ("kafka.sasl.jaas.config" in options) == ("sasl.mechanism" in client)
    tls = client["security.protocol"] == "SSL"
    assert any(k.startswith("kafka.ssl.") for k in options) == tls, options
    assert "kafka.ssl.keystore.type" not in options
    assert settings.principal() == ("User:u" if "sasl.username" in client else "User:ANONYMOUS")
