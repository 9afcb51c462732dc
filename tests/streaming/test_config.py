"""Configuration precedence and validation (pure logic, no services)."""

from pathlib import Path

import pytest

from streaming.config import ConfigError, default_config_file, load, parse_set_flags


def test_packaged_file_declares_the_default_exchanges():
    cfg = load(environ={})
    assert dict(cfg.exchanges.dialects) == {"amq.topic": "amqp", "mqtt": "mqtt"}
    assert cfg.exchanges.default == "amq.topic"
    assert cfg.kafka.bootstrap == "127.0.0.1:9092"
    assert default_config_file().name == "bitroute.toml"


def test_the_documented_file_and_the_built_in_defaults_agree_key_for_key():
    """conf/bitroute.toml documents every key with its default; config.py's dataclasses are
    the defaults when a key is unset. Neither may drift: same sections, same keys, and each
    value in the file is the built-in default once converted."""
    import dataclasses
    import tomllib

    from streaming import config as module

    raw = tomllib.loads(default_config_file().read_text(encoding="utf-8"))
    assert sorted(raw) == sorted(module._SECTION_TYPES)
    for section, cls in module._SECTION_TYPES.items():
        names = [f.name for f in dataclasses.fields(cls)]
        assert sorted(raw[section]) == sorted(names), section
        built = module._build_section(section, raw[section])
        for name in names:
            assert getattr(built, name) == getattr(cls(), name), f"{section}.{name}"


def test_precedence_flag_over_environment_over_file_over_default(tmp_path: Path):
    file = tmp_path / "b.toml"
    file.write_text('[kafka]\nbootstrap = "file:1"\npartitions = 3\n')
    env = {"BITROUTE_KAFKA_BOOTSTRAP": "env:2"}

    assert load(file, environ={}).kafka.bootstrap == "file:1"
    assert load(file, environ=env).kafka.bootstrap == "env:2"
    assert load(file, {"kafka.bootstrap": "flag:3"}, environ=env).kafka.bootstrap == "flag:3"
    # A key absent everywhere keeps its built-in default.
    assert load(file, environ=env).kafka.rejected_topic == "bitroute.rejected"
    # The file still wins over the default for keys nothing else sets.
    assert load(file, environ=env).kafka.partitions == 3


def test_environment_values_are_converted_to_the_field_type():
    cfg = load(environ={"BITROUTE_KAFKA_PARTITIONS": "6", "BITROUTE_BROKER_EMBEDDED": "false"})
    assert cfg.kafka.partitions == 6
    assert cfg.broker.embedded is False


@pytest.mark.parametrize("overrides, key", [
    ({"kafka.partitions": "two"}, "kafka.partitions"),
    ({"kafka.partitions": "0"}, "kafka.partitions"),
    ({"kafka.bootstrap": "no-port"}, "kafka.bootstrap"),
    ({"kafka.rejected_topic": "bad topic!"}, "kafka.rejected_topic"),
    ({"exchanges.default": "nope"}, "exchanges.default"),
    ({"broker.host": "0.0.0.0"}, "broker.host"),
    ({"broker.port": "70000"}, "broker.port"),
    ({"spark.log_level": "LOUD"}, "spark.log_level"),
    ({"streaming.trigger_interval": "soon"}, "streaming.trigger_interval"),
    ({"kafka.no_such_key": "1"}, "kafka.no_such_key"),
    ({"kafka.delivery_linger_ms": "-1"}, "kafka.delivery_linger_ms"),
    ({"kafka.delivery_linger_ms": "60000"}, "kafka.delivery_linger_ms"),
])
def test_bad_value_names_the_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        load(overrides=overrides, environ={})
    assert str(err.value).startswith(key)


def test_bad_environment_key_and_bad_file_are_named(tmp_path: Path):
    with pytest.raises(ConfigError, match="kafka.bootstrapp"):
        load(environ={"BITROUTE_KAFKA_BOOTSTRAPP": "x:1"})
    file = tmp_path / "bad.toml"
    file.write_text("[exchanges.dialects]\nfoo = \"stomp\"\n")
    with pytest.raises(ConfigError, match="exchanges.dialects.foo"):
        load(file, environ={})
    with pytest.raises(ConfigError, match="not found"):
        load(tmp_path / "missing.toml", environ={})
    (tmp_path / "broken.toml").write_text("[kafka\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(tmp_path / "broken.toml", environ={})


def test_set_flags_parse_and_reject_malformed_pairs():
    assert parse_set_flags(["kafka.bootstrap=h:1", "spark.master=local[1]"]) == {
        "kafka.bootstrap": "h:1", "spark.master": "local[1]"}
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_set_flags(["bootstrap"])


def test_set_flags_reach_entries_of_tables():
    cfg = load(overrides={"spark.options.spark.executor.memory": "2g",
                          "exchanges.dialects.events": "amqp"}, environ={})
    assert cfg.spark.options == {"spark.executor.memory": "2g"}
    assert cfg.exchanges.dialects["events"] == "amqp"
    assert cfg.exchanges.dialects["mqtt"] == "mqtt"
    with pytest.raises(ConfigError, match="exchanges.dialects.events"):
        load(overrides={"exchanges.dialects.events": "stomp"}, environ={})


def test_relative_local_paths_are_resolved_against_the_current_directory(workdir: Path):
    cfg = load(environ={})
    assert cfg.delta.warehouse == str(workdir / ".bitroute" / "delta")
    assert cfg.streaming.checkpoint_dir == workdir / ".bitroute" / "checkpoints"
    assert cfg.broker.data_dir == workdir / ".bitroute" / "broker"
    remote = load(overrides={"delta.warehouse": "s3a://bucket/audit"}, environ={})
    assert remote.delta.warehouse == "s3a://bucket/audit"


def test_the_driver_route_bounds_are_chosen_by_the_master_unless_set():
    config = load(environ={})
    assert config.streaming.driver_route_max_publishes is None  # "auto" in conf/bitroute.toml
    assert config.streaming.driver_route_bounds("local[*]") == (20_000, 100_000)
    assert config.streaming.driver_route_bounds("spark://master:7077") == (0, 0)
    assert config.streaming.driver_route_bounds("yarn") == (0, 0)
    set_both = load(overrides={"streaming.driver_route_max_publishes": "500",
                               "streaming.driver_route_max_deliveries": "auto"}, environ={})
    assert set_both.streaming.driver_route_bounds("spark://master:7077") == (500, 2_500)
    from_env = load(environ={"BITROUTE_STREAMING_DRIVER_ROUTE_MAX_DELIVERIES": "7"})
    assert from_env.streaming.driver_route_bounds("local[2]") == (20_000, 7)


@pytest.mark.parametrize("value", ["-1", "many", "1.5"])
def test_a_bad_driver_route_bound_names_the_key(value):
    with pytest.raises(ConfigError, match="streaming.driver_route_max_deliveries"):
        load(overrides={"streaming.driver_route_max_deliveries": value}, environ={})


def test_who_writes_the_executors_audit_files_is_chosen_by_the_master_unless_set():
    config = load(environ={})
    assert config.streaming.executor_audit_files == "auto"  # conf/bitroute.toml
    assert not config.streaming.task_audit_files("local[*]")
    assert config.streaming.task_audit_files("spark://master:7077")
    tasks = load(overrides={"streaming.executor_audit_files": "tasks"}, environ={})
    assert tasks.streaming.task_audit_files("local[2]")
    driver = load(overrides={"streaming.executor_audit_files": "driver"}, environ={})
    assert not driver.streaming.task_audit_files("yarn")
    with pytest.raises(ConfigError, match="streaming.executor_audit_files"):
        load(overrides={"streaming.executor_audit_files": "workers"}, environ={})


def test_a_batch_is_routed_in_the_driver_only_within_both_bounds():
    from streaming.router.batch.report import BatchReport
    from streaming.router.service import within_driver_bounds

    bounds = (20_000, 100_000)
    assert within_driver_bounds(20_000, bounds, [])  # no history: one delivery per publish
    assert not within_driver_bounds(20_001, bounds, [])
    assert not within_driver_bounds(None, bounds, [])  # size unknown: the executors
    assert not within_driver_bounds(1, (0, 0), [])
    fan_out = [BatchReport(1, 100, 1_000, 0, 1, 0.1, False),  # 10 per publish
               BatchReport(2, 0, 0, 0, 1, 0.1, False)]
    assert within_driver_bounds(10_000, bounds, fan_out)
    assert not within_driver_bounds(10_001, bounds, fan_out)  # 100,010 estimated deliveries
