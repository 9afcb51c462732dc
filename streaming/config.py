"""The one configuration object, and the one place the environment is read.

Precedence, highest first:

1. command-line overrides (``--set section.key=value`` and verb flags such as
   ``--port``), passed to :func:`load` as ``overrides``; an entry of a table
   is set with ``--set spark.options.spark.executor.memory=2g`` or
   ``--set exchanges.dialects.events=amqp``;
2. environment variables ``BITROUTE_<SECTION>_<KEY>`` (``BITROUTE_KAFKA_BOOTSTRAP``);
3. the TOML file given with ``--config FILE``, else ``conf/bitroute.toml``;
4. the built-in defaults of the dataclasses below.

Every value is validated before anything starts; a bad one raises
:class:`ConfigError` whose message names the key (``kafka.partitions: expected
an integer >= 1, got 'two'``). The result is frozen.

Example::

    >>> cfg = load(overrides={"kafka.bootstrap": "127.0.0.1:19092"}, environ={})
    >>> cfg.kafka.bootstrap
    '127.0.0.1:19092'
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import conf
from schemas.records import DELIVERY_LAYOUTS, LAYOUT_TOPIC_PER_SUBSCRIBER
from streaming.errors import ConfigError
from streaming.kafka.layout import DeliveryLayout
from streaming.kafka.settings import REDACTED, ClientSettings, ClientSettingsError, resolve_properties

ENV_PREFIX = "BITROUTE_"
DIALECTS = ("amqp", "mqtt")
_HOST_PORT = re.compile(r"^[A-Za-z0-9._\-\[\]:]+:\d{1,5}$")
_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._\-]{1,249}$")
_INTERVAL = re.compile(r"^\d+(\.\d+)?\s+(milliseconds?|seconds?|minutes?)$")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s+(millisecond|second|minute|hour|day)s?$")
_DURATION_SECONDS = {"millisecond": 0.001, "second": 1.0, "minute": 60.0, "hour": 3600.0,
                     "day": 86400.0}
_LOG_LEVELS = ("ERROR", "WARN", "INFO", "DEBUG")


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap: str = "127.0.0.1:9092"
    publishes_topic: str = "bitroute.publishes"
    subscriptions_topic: str = "bitroute.subscriptions"
    rejected_topic: str = "bitroute.rejected"
    retained_topic: str = "bitroute.retained"
    """The MQTT exchanges' retained messages: compacted, keyed by exchange and topic
    (:mod:`streaming.router.retained`)."""
    routing_view_topic: str = "bitroute.routing-view"
    """Realtime mode: the applied subscriptions the driver hands the executors' matchers
    (compacted, one partition; :mod:`streaming.realtime.view`)."""
    routed_topic: str = "bitroute.routed"
    """Realtime mode: one record per routed publish, which the audit query reads
    (:mod:`streaming.realtime.audit`)."""
    deliveries_topic_prefix: str = "bitroute.deliveries."
    partitions: int = 2
    replication_factor: int = 1
    delivery_partitions: int = 1
    min_insync_replicas: int = 0
    max_delivery_bytes: int = 1_048_576
    delivery_linger_ms: int = 1000
    delivery_layout: str = LAYOUT_TOPIC_PER_SUBSCRIBER
    shared_deliveries_topic: str = "bitroute.deliveries"
    shared_delivery_partitions: int = 16
    client: Mapping[str, str] = field(default_factory=dict)
    """``[kafka.client]``: librdkafka properties for every client (TLS, SASL), checked and
    resolved (``env:``/``file:`` values read) at load; :class:`ClientProperties`."""

    @property
    def client_settings(self) -> ClientSettings:
        """The connection every Kafka client is built from (:mod:`streaming.kafka`)."""
        return ClientSettings.of(self.bootstrap, self.client)

    @functools.cached_property
    def layout(self) -> DeliveryLayout:
        """The delivery layout (``delivery_layout`` and the topic keys it reads): a
        subscriber's topic, its record key, the partitions of a delivery topic."""
        return DeliveryLayout.of(self)


@dataclass(frozen=True)
class BrokerConfig:
    embedded: bool = True
    host: str = "127.0.0.1"
    port: int = 9092
    controller_port: int = 9093
    data_dir: Path = Path(".bitroute/broker")


@dataclass(frozen=True)
class ExchangesConfig:
    default: str = "amq.topic"
    dialects: Mapping[str, str] = field(
        default_factory=lambda: {"amq.topic": "amqp", "mqtt": "mqtt"}
    )
    alternates: Mapping[str, str] = field(default_factory=dict)
    """``[exchanges.alternates]``: an AMQP exchange's alternate exchange (RabbitMQ's
    ``alternate-exchange``), another AMQP exchange. A publish its own exchange routes to
    no one is matched once against the alternate's subscriptions; the alternate's own
    alternate is not followed (docs/design.md, "Alternate exchanges")."""

    def alternate(self, exchange: str) -> str | None:
        """The alternate exchange of ``exchange``, None when it names none."""
        return self.alternates.get(exchange)


@dataclass(frozen=True)
class DeltaConfig:
    warehouse: str = ".bitroute/delta"
    allow_unsafe_commits: bool = False
    """Accept an object store that ignores conditional writes (:mod:`streaming.audit.storage`)."""

    def table_path(self, table: str) -> str:
        """Location of one audit table (deliveries, messages, subscriptions)."""
        return f"{self.warehouse.rstrip('/')}/{table}"


@dataclass(frozen=True)
class AuditConfig:
    """How the publish audit reaches Delta, and the upkeep that keeps the tables' cost flat.

    Durations are strings such as ``"2 seconds"`` or ``"24 hours"``
    (:func:`duration_seconds`); conf/bitroute.toml documents each key.
    """

    commit_interval: str = "2 seconds"
    max_pending_batches: int = 1000
    maintenance_interval: str = "60 seconds"
    target_file_size: int = 128 * 1024 * 1024
    compact_min_files: int = 16
    file_retention: str = "1 hours"
    log_retention: str = "24 hours"
    retention_days: int = 0

    @property
    def commit_interval_s(self) -> float:
        return duration_seconds(self.commit_interval)

    @property
    def maintenance_interval_s(self) -> float:
        return duration_seconds(self.maintenance_interval)

    @property
    def file_retention_s(self) -> float:
        return duration_seconds(self.file_retention)

    @property
    def log_retention_s(self) -> float:
        return duration_seconds(self.log_retention)


RETENTION_GAP_POLICIES = ("resume", "stop")
"""The values of ``streaming.on_retention_gap``."""

AutoCount = int | None
"""A count that may be ``"auto"`` in the file and the environment (None here)."""

LOCAL_DRIVER_ROUTE_MAX_PUBLISHES = 20_000
"""``streaming.driver_route_max_publishes = "auto"`` on a ``local[...]`` master (conf/bitroute.toml
says why)."""
MODE_MICROBATCH = "microbatch"
MODE_REALTIME = "realtime"
STREAMING_MODES = (MODE_MICROBATCH, MODE_REALTIME)
"""``streaming.mode``'s values."""

DRIVER_ROUTE_DELIVERIES_PER_PUBLISH = 5
"""``streaming.driver_route_max_deliveries = "auto"``: this many times the publishes' bound."""
AUDIT_FILES_AUTO, AUDIT_FILES_TASKS, AUDIT_FILES_DRIVER = "auto", "tasks", "driver"
AUDIT_FILES_WRITERS = (AUDIT_FILES_AUTO, AUDIT_FILES_TASKS, AUDIT_FILES_DRIVER)
"""``streaming.executor_audit_files``' values."""


@dataclass(frozen=True)
class StreamingConfig:
    checkpoint_dir: Path = Path(".bitroute/checkpoints")
    mode: str = "microbatch"
    """``microbatch`` (the default): the foreachBatch router. ``realtime``: Spark's
    Real-Time Mode, matching in the JVM (:mod:`streaming.realtime`)."""
    realtime_checkpoint_interval: str = "5 seconds"
    """Realtime mode: how often Spark checkpoints the routing query (its trigger); the
    audit of a publish waits for the checkpoint after it (docs/design.md, "Realtime mode")."""
    realtime_clock_skew_ms: int = 0
    """Realtime mode: how far the publishers' clocks may be behind the executors'
    (happens-before: :mod:`streaming.realtime.view`)."""
    trigger_interval: str = "100 milliseconds"
    max_offsets_per_trigger: int = 100_000
    driver_route_max_publishes: AutoCount = None
    driver_route_max_deliveries: AutoCount = None
    executor_audit_files: str = AUDIT_FILES_AUTO
    """Who writes the audit files of a batch the executors route
    (:meth:`task_audit_files`): ``tasks``, ``driver`` or ``auto``."""
    lease_timeout: str = "60 seconds"
    """A router lease not renewed for this long is stale (:mod:`streaming.state.lease`)."""
    on_retention_gap: str = "resume"
    """What the router does when publishes it has not read were deleted by Kafka
    (:mod:`streaming.router.topics.retention`): ``resume`` records the gap and routes on from the
    earliest offset Kafka keeps; ``stop`` stops the router until a run acknowledges it."""
    replay_chunk_publishes: int = 20_000
    """Publishes one replay chunk reads at most (``subscribe --since``,
    :mod:`streaming.router.replay.replay`): one Spark job, one flush, one audit commit, one
    progress record."""
    replay_share: int = 50
    """The percent of the time a replay works: after a chunk that took t seconds it waits
    t * (100 - share) / share, so that the live batches keep the rest of the machine
    (100: no wait)."""

    @property
    def lease_timeout_s(self) -> float:
        return duration_seconds(self.lease_timeout)

    def driver_route_bounds(self, master: str) -> tuple[int, int]:
        """The largest batch routed in the driver under Spark master ``master``, as
        (publishes, deliveries). ``driver_route_max_publishes = "auto"`` (None) is
        :data:`LOCAL_DRIVER_ROUTE_MAX_PUBLISHES` on a ``local[...]`` master and 0 on a
        cluster, where the executors route every batch and the driver does no work per
        publish or delivery; ``driver_route_max_deliveries = "auto"`` is
        :data:`DRIVER_ROUTE_DELIVERIES_PER_PUBLISH` times the publishes' bound."""
        publishes, deliveries = self.driver_route_max_publishes, self.driver_route_max_deliveries
        if publishes is None:
            publishes = LOCAL_DRIVER_ROUTE_MAX_PUBLISHES if master.startswith("local") else 0
        if deliveries is None:
            deliveries = DRIVER_ROUTE_DELIVERIES_PER_PUBLISH * publishes
        return publishes, deliveries

    def task_audit_files(self, master: str) -> bool:
        """Whether each routing task on the executors writes its publishes' audit files
        itself after Kafka's acks (True), or returns its routed rows for the driver to
        journal and its committer to write beside the next batch (False), under Spark
        master ``master``. ``executor_audit_files = "auto"``: the tasks on a cluster,
        where the driver is the one process a cluster cannot add more of; the driver on
        a ``local[...]`` master, where both are this machine's CPU and the files written
        inside the routing task lengthen every batch (conf/bitroute.toml says by how much)."""
        if self.executor_audit_files == AUDIT_FILES_AUTO:
            return not master.startswith("local")
        return self.executor_audit_files == AUDIT_FILES_TASKS


@dataclass(frozen=True)
class SparkConfig:
    master: str = "local[*]"
    app_name: str = "bitroute"
    shuffle_partitions: int = 4
    log_level: str = "WARN"
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class MetricsConfig:
    """The Prometheus endpoint of ``bitroute run`` (:mod:`streaming.ops.metrics`): port 0 = off."""

    host: str = "127.0.0.1"
    port: int = 0


LIMIT_NAMES = ("max_subscriptions_per_subscriber", "max_subscriptions_per_exchange",
               "max_filter_levels", "max_filter_length", "max_header_criteria")
"""The limits a subscription is held to (``[limits]``; :mod:`streaming.router.subscriptions.limits`)."""


@dataclass(frozen=True)
class LimitsConfig:
    """``[limits]``: what one subscription, one subscriber and one exchange may hold
    (:mod:`streaming.router.subscriptions.limits` checks them; docs/design.md, "Limits")."""

    max_subscriptions_per_subscriber: int = 10_000
    """A subscriber's live subscriptions on one exchange."""
    max_subscriptions_per_exchange: int = 10_000_000
    """An exchange's live subscriptions."""
    max_filter_levels: int = 128
    """Words (AMQP) or levels (MQTT) of a filter, that of a ``$share/<group>/`` filter after
    its group; EMQX's ``max_topic_levels`` default."""
    max_filter_length: int = 65_535
    """Bytes (UTF-8) of a filter as written; MQTT's longest topic filter."""
    max_header_criteria: int = 64
    """Header criteria of one subscription."""
    exchanges: Mapping[str, str] = field(default_factory=dict)
    """``[limits.exchanges]``: an exchange's own value of a limit, keyed
    ``"<exchange>.<limit>"`` (``"mqtt.max_filter_levels" = 32``)."""

    def of(self, exchange: str, name: str) -> int:
        """The value of limit ``name`` for ``exchange`` (its override, else the default)."""
        value = self.exchanges.get(f"{exchange}.{name}")
        return getattr(self, name) if value is None else int(value)

    def key(self, exchange: str, name: str) -> str:
        """The configuration key that sets limit ``name`` for ``exchange``."""
        if f"{exchange}.{name}" in self.exchanges:
            return f'limits.exchanges."{exchange}.{name}"'
        return f"limits.{name}"


@dataclass(frozen=True)
class Config:
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    exchanges: ExchangesConfig = field(default_factory=ExchangesConfig)
    delta: DeltaConfig = field(default_factory=DeltaConfig)
    streaming: StreamingConfig = field(default_factory=StreamingConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)


_SECTION_TYPES = {
    "kafka": KafkaConfig,
    "broker": BrokerConfig,
    "exchanges": ExchangesConfig,
    "delta": DeltaConfig,
    "streaming": StreamingConfig,
    "audit": AuditConfig,
    "spark": SparkConfig,
    "metrics": MetricsConfig,
    "limits": LimitsConfig,
}
# Keys whose value is a table of free-form names (not settable from the environment).
_TABLE_KEYS = {("exchanges", "dialects"), ("exchanges", "alternates"), ("spark", "options"),
               ("kafka", "client"), ("limits", "exchanges")}


class ClientProperties(dict):
    """The resolved ``[kafka.client]`` properties: a dict whose ``repr`` hides secret values."""

    def __repr__(self) -> str:
        return repr({k: REDACTED if k.endswith("password") else v for k, v in self.items()})

    __str__ = __repr__


def default_config_file() -> Path:
    """The documented defaults shipped in ``conf/bitroute.toml``."""
    return conf.path("bitroute.toml")


def load(
    config_file: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Build the validated configuration from file, environment and overrides.

    ``overrides`` maps dotted keys (``"kafka.bootstrap"``) to values (strings
    are converted like environment values). ``environ`` defaults to
    ``os.environ``. Raises :class:`ConfigError` naming the offending key.
    """
    path = Path(config_file) if config_file is not None else default_config_file()
    raw = _read_toml(path)
    layered: dict[str, dict[str, Any]] = {name: {} for name in _SECTION_TYPES}
    for section, values in raw.items():
        if section not in _SECTION_TYPES:
            raise ConfigError(f"{section}: unknown section in {path}")
        if not isinstance(values, dict):
            raise ConfigError(f"{section}: expected a table in {path}")
        for key, value in values.items():
            _check_known(section, key)
            layered[section][key] = value

    env = os.environ if environ is None else environ
    # BITROUTE_KAFKA_PASSWORD read by "env:BITROUTE_KAFKA_PASSWORD" is a secret, not a key.
    referenced = {str(v)[4:] for v in [*dict(layered["kafka"].get("client") or {}).values(),
                                       *(v for k, v in (overrides or {}).items()
                                         if k.startswith("kafka.client."))]
                  if str(v).startswith("env:")}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or name in referenced:
            continue
        env_section, key = _env_key(name)
        if env_section is None:
            continue
        layered[env_section][key] = value

    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        section, _, key = dotted.partition(".")
        if section not in _SECTION_TYPES or not key:
            raise ConfigError(f"{dotted}: unknown configuration key")
        table, _, name = key.partition(".")
        if (section, table) in _TABLE_KEYS and name:
            # "spark.options.spark.executor.memory=2g" sets one entry of a table.
            entries = dict(layered[section].get(table, {}))
            entries[name] = value
            layered[section][table] = entries
            continue
        _check_known(section, key)
        layered[section][key] = value

    if "client" in layered["kafka"]:
        raw_client = layered["kafka"]["client"]
        if not isinstance(raw_client, dict):
            raise ConfigError(f"kafka.client: expected a table, got {raw_client!r}")
        try:
            layered["kafka"]["client"] = ClientProperties(resolve_properties(raw_client, env))
        except ClientSettingsError as exc:
            raise ConfigError(str(exc)) from None
    sections = {name: _build_section(name, values) for name, values in layered.items()}
    config = Config(**sections)
    _validate(config)
    return _absolute_paths(config)


def _absolute_paths(config: Config) -> Config:
    """Resolve relative local paths against the current directory, once, at load.

    Spark and Delta misread a relative path such as ``.bitroute/delta`` (a
    leading dot parses as a table name), and a child process may run elsewhere.
    """
    warehouse = config.delta.warehouse
    if "://" not in warehouse and not warehouse.startswith("/"):
        warehouse = str(Path(warehouse).absolute())
    return dataclasses.replace(
        config,
        broker=dataclasses.replace(config.broker, data_dir=config.broker.data_dir.absolute()),
        delta=dataclasses.replace(config.delta, warehouse=warehouse),
        streaming=dataclasses.replace(
            config.streaming, checkpoint_dir=config.streaming.checkpoint_dir.absolute()),
    )


def parse_set_flags(pairs: list[str] | None) -> dict[str, str]:
    """Turn ``--set section.key=value`` flags into an overrides mapping."""
    result: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or "." not in key:
            raise ConfigError(f"--set {pair!r}: expected section.key=value")
        result[key.strip()] = value
    return result


def duration_seconds(text: str) -> float:
    """Seconds in a duration such as ``"500 milliseconds"``, ``"2 seconds"``, ``"24 hours"``
    or ``"7 days"`` (singular or plural unit). Raises ``ValueError`` on any other text."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise ValueError(f"not a duration: {text!r}")
    return float(match.group(1)) * _DURATION_SECONDS[match.group(2)]


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def _check_known(section: str, key: str) -> None:
    names = {f.name for f in dataclasses.fields(_SECTION_TYPES[section])}
    if key not in names:
        raise ConfigError(f"{section}.{key}: unknown configuration key")


def _env_key(name: str) -> tuple[str | None, str]:
    """Map BITROUTE_KAFKA_BOOTSTRAP to ("kafka", "bootstrap"); unknown names are errors."""
    rest = name[len(ENV_PREFIX):].lower()
    for section in _SECTION_TYPES:
        if rest.startswith(section + "_"):
            key = rest[len(section) + 1:]
            if (section, key) in _TABLE_KEYS:
                raise ConfigError(f"{name}: {section}.{key} can only be set in the config file")
            _check_known(section, key)
            return section, key
    # BITROUTE_HOME and the like are not configuration keys.
    return None, ""


def _build_section(section: str, values: Mapping[str, Any]) -> Any:
    cls = _SECTION_TYPES[section]
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        kwargs[f.name] = _convert(f"{section}.{f.name}", f.type, values[f.name])
    return cls(**kwargs)


def _convert(key: str, type_name: Any, value: Any) -> Any:
    """Convert a TOML or string value to the field's type, or raise ConfigError."""
    kind = str(type_name)
    if kind == "AutoCount":
        if isinstance(value, str) and value.strip().lower() == "auto":
            return None
        try:
            return _convert(key, "int", value)
        except ConfigError:
            raise ConfigError(f"{key}: expected \"auto\" or an integer, got {value!r}") from None
    if kind == "int":
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        try:
            return int(str(value).strip())
        except ValueError:
            raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
    if kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if kind == "Path":
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{key}: expected a non-empty path, got {value!r}")
        return Path(value)
    if isinstance(value, ClientProperties):
        return value
    if kind.startswith("Mapping"):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table, got {value!r}")
        if key == "limits.exchanges":  # [limits.exchanges.mqtt] max_filter_levels = 32, too
            value = _flattened(value)
        return {str(k): str(v) if not isinstance(v, bool) else str(v).lower() for k, v in value.items()}
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def _flattened(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A TOML table's nested tables as dotted keys: ``{"mqtt": {"a": 1}}`` -> ``{"mqtt.a": 1}``."""
    flat: dict[str, Any] = {}
    for k, v in table.items():
        if isinstance(v, dict):
            flat.update(_flattened(v, f"{prefix}{k}."))
        else:
            flat[f"{prefix}{k}"] = v
    return flat


def _validate(config: Config) -> None:
    def require(ok: bool, key: str, what: str, value: Any) -> None:
        if not ok:
            raise ConfigError(f"{key}: expected {what}, got {value!r}")

    kafka = config.kafka
    servers = kafka.bootstrap.split(",")
    require(all(_HOST_PORT.match(s.strip()) for s in servers), "kafka.bootstrap",
            "host:port[,host:port...]", kafka.bootstrap)
    for name in ("publishes_topic", "subscriptions_topic", "rejected_topic", "retained_topic"):
        value = getattr(kafka, name)
        require(bool(_TOPIC_NAME.match(value)), f"kafka.{name}",
                "a Kafka topic name ([A-Za-z0-9._-], 1..249 chars)", value)
    require(bool(re.match(r"^[A-Za-z0-9._\-]{1,40}$", kafka.deliveries_topic_prefix)),
            "kafka.deliveries_topic_prefix", "1..40 chars of [A-Za-z0-9._-]",
            kafka.deliveries_topic_prefix)
    require(kafka.delivery_layout in DELIVERY_LAYOUTS, "kafka.delivery_layout",
            " or ".join(repr(name) for name in DELIVERY_LAYOUTS), kafka.delivery_layout)
    require(bool(_TOPIC_NAME.match(kafka.shared_deliveries_topic))
            and not kafka.shared_deliveries_topic.startswith(kafka.deliveries_topic_prefix),
            "kafka.shared_deliveries_topic",
            "a Kafka topic name that does not start with kafka.deliveries_topic_prefix",
            kafka.shared_deliveries_topic)
    require(kafka.shared_delivery_partitions >= 1, "kafka.shared_delivery_partitions",
            "an integer >= 1", kafka.shared_delivery_partitions)
    require(kafka.partitions >= 1, "kafka.partitions", "an integer >= 1", kafka.partitions)
    require(kafka.delivery_partitions >= 1, "kafka.delivery_partitions", "an integer >= 1",
            kafka.delivery_partitions)
    require(kafka.replication_factor >= 1, "kafka.replication_factor", "an integer >= 1",
            kafka.replication_factor)
    require(0 <= kafka.min_insync_replicas <= kafka.replication_factor, "kafka.min_insync_replicas",
            "0 (the broker's default) or 1..kafka.replication_factor", kafka.min_insync_replicas)
    require(1024 <= kafka.max_delivery_bytes <= 1 << 30, "kafka.max_delivery_bytes",
            "an integer of bytes in 1024..1073741824", kafka.max_delivery_bytes)
    # librdkafka refuses a linger.ms at or above the message timeout (60 s).
    require(0 <= kafka.delivery_linger_ms < 60_000, "kafka.delivery_linger_ms",
            "an integer of milliseconds in 0..59999", kafka.delivery_linger_ms)

    broker = config.broker
    for name in ("port", "controller_port"):
        value = getattr(broker, name)
        require(0 < value < 65536, f"broker.{name}", "a port number 1..65535", value)
    require(broker.port != broker.controller_port, "broker.controller_port",
            "a port different from broker.port", broker.controller_port)
    require(broker.host in ("127.0.0.1", "localhost", "::1"), "broker.host",
            "a loopback address (the embedded broker never listens elsewhere)", broker.host)

    exchanges = config.exchanges
    require(bool(exchanges.dialects), "exchanges.dialects", "at least one exchange",
            exchanges.dialects)
    for name, dialect in exchanges.dialects.items():
        require(dialect in DIALECTS, f"exchanges.dialects.{name}", "'amqp' or 'mqtt'", dialect)
        require(bool(name) and len(name) <= 255, f"exchanges.dialects.{name}",
                "an exchange name of 1..255 characters", name)
    require(exchanges.default in exchanges.dialects, "exchanges.default",
            f"one of the declared exchanges {sorted(exchanges.dialects)}", exchanges.default)
    for name, alternate in exchanges.alternates.items():
        key = f'exchanges.alternates."{name}"'
        require(exchanges.dialects.get(name) == "amqp", key,
                "a key naming a declared AMQP exchange (an alternate exchange is AMQP's)", name)
        require(exchanges.dialects.get(alternate) == "amqp", key,
                "the name of another declared AMQP exchange", alternate)
        require(alternate != name, key, "an exchange other than itself", alternate)

    require(bool(config.delta.warehouse), "delta.warehouse", "a folder or URI",
            config.delta.warehouse)

    streaming = config.streaming
    require(bool(_INTERVAL.match(streaming.trigger_interval)), "streaming.trigger_interval",
            "an interval such as '1 second' or '500 milliseconds'", streaming.trigger_interval)
    require(streaming.mode in STREAMING_MODES, "streaming.mode", " or ".join(
        repr(m) for m in STREAMING_MODES), streaming.mode)
    require(bool(_INTERVAL.match(streaming.realtime_checkpoint_interval))
            and duration_seconds(streaming.realtime_checkpoint_interval) >= 5,
            "streaming.realtime_checkpoint_interval",
            "an interval of at least '5 seconds' (Spark's Real-Time Mode minimum)",
            streaming.realtime_checkpoint_interval)
    require(streaming.realtime_clock_skew_ms >= 0, "streaming.realtime_clock_skew_ms",
            "an integer >= 0", streaming.realtime_clock_skew_ms)
    require(streaming.max_offsets_per_trigger >= 1, "streaming.max_offsets_per_trigger",
            "an integer >= 1", streaming.max_offsets_per_trigger)
    require(streaming.replay_chunk_publishes >= 1, "streaming.replay_chunk_publishes",
            "an integer >= 1", streaming.replay_chunk_publishes)
    require(1 <= streaming.replay_share <= 100, "streaming.replay_share",
            "an integer from 1 to 100", streaming.replay_share)
    for name in ("driver_route_max_publishes", "driver_route_max_deliveries"):
        value = getattr(streaming, name)
        require(value is None or value >= 0, f"streaming.{name}",
                '"auto" or an integer >= 0 (0: every batch is routed on the executors)', value)
    require(streaming.executor_audit_files in AUDIT_FILES_WRITERS, "streaming.executor_audit_files",
            " or ".join(repr(w) for w in AUDIT_FILES_WRITERS), streaming.executor_audit_files)
    require(bool(_DURATION.match(streaming.lease_timeout.strip()))
            and duration_seconds(streaming.lease_timeout) >= 5, "streaming.lease_timeout",
            "a duration of at least 5 seconds, such as '60 seconds'", streaming.lease_timeout)

    require(streaming.on_retention_gap in RETENTION_GAP_POLICIES, "streaming.on_retention_gap",
            " or ".join(repr(p) for p in RETENTION_GAP_POLICIES), streaming.on_retention_gap)

    audit = config.audit
    for name in ("commit_interval", "maintenance_interval", "file_retention", "log_retention"):
        value = getattr(audit, name)
        require(bool(_DURATION.match(value.strip())), f"audit.{name}",
                "a duration such as '2 seconds', '30 minutes', '24 hours' or '7 days'", value)
    require(0 < audit.commit_interval_s <= 10, "audit.commit_interval",
            "a duration of at most 10 seconds (an audit row lands within it)", audit.commit_interval)
    require(audit.max_pending_batches >= 1, "audit.max_pending_batches", "an integer >= 1",
            audit.max_pending_batches)
    require(audit.maintenance_interval_s >= 1, "audit.maintenance_interval",
            "a duration of at least 1 second", audit.maintenance_interval)
    require(audit.target_file_size >= 1 << 20, "audit.target_file_size",
            "an integer of bytes >= 1048576", audit.target_file_size)
    require(audit.compact_min_files >= 2, "audit.compact_min_files", "an integer >= 2",
            audit.compact_min_files)
    require(audit.retention_days >= 0, "audit.retention_days",
            "0 (keep every row) or a number of days >= 1", audit.retention_days)

    spark = config.spark
    require(bool(spark.master), "spark.master", "a Spark master URL", spark.master)
    require(spark.shuffle_partitions >= 1, "spark.shuffle_partitions", "an integer >= 1",
            spark.shuffle_partitions)
    require(spark.log_level in _LOG_LEVELS, "spark.log_level", " or ".join(_LOG_LEVELS),
            spark.log_level)

    limits = config.limits
    for name in LIMIT_NAMES:
        require(getattr(limits, name) >= 1, f"limits.{name}", "an integer >= 1",
                getattr(limits, name))
    for key, value in limits.exchanges.items():
        exchange, _, name = key.rpartition(".")
        require(exchange in exchanges.dialects and name in LIMIT_NAMES,
                f'limits.exchanges."{key}"', "a key <exchange>.<limit> naming a declared "
                f"exchange and one of {', '.join(LIMIT_NAMES)}", key)
        require(value.strip().isdigit() and int(value) >= 1, f'limits.exchanges."{key}"',
                "an integer >= 1", value)

    metrics = config.metrics
    require(0 <= metrics.port < 65536, "metrics.port", "0 (off) or a port number 1..65535",
            metrics.port)
    require(_is_address(metrics.host), "metrics.host",
            "an IP address to listen on (127.0.0.1, the default: this host only; 0.0.0.0 or "
            "the pod's address for a scraper elsewhere) or localhost", metrics.host)


def _is_address(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
