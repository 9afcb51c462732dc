"""deploy/systemd/: the router's unit and its environment file, checked against systemd's
own verifier and the router's configuration keys."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from streaming.config import load, parse_set_flags

FOLDER = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
UNIT = FOLDER / "bitroute.service"
ENV_FILE = FOLDER / "bitroute.env"


def _directives(text: str) -> dict[str, dict[str, str]]:
    """The unit's sections and directives, continuation lines joined as systemd does."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
        else:
            key, _, value = line.partition("=")
            current[key.strip()] = value.strip()
    return sections


def _environment() -> dict[str, str]:
    lines = [line for line in ENV_FILE.read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def test_the_unit_runs_the_router_with_settings_it_accepts():
    service = _directives(UNIT.read_text())["Service"]
    command = shlex.split(service["ExecStart"])
    assert command[0].endswith("/bin/bitroute") and command[1] == "run"
    flags = command[2:]
    assert flags[0::2] == ["--set"] * (len(flags) // 2)
    sets = [flag.replace("%H", "router-host") for flag in flags[1::2]]
    config = load(overrides=parse_set_flags(sets), environ=_environment())
    assert config.spark.master.startswith("spark://")
    assert config.spark.options["spark.driver.host"] == "router-host"
    assert config.kafka.min_insync_replicas == 2 and not config.broker.embedded
    assert str(config.streaming.checkpoint_dir).startswith(
        "/var/lib/" + service["StateDirectory"] + "/")


def test_a_stop_lets_the_batch_finish_and_a_failure_restarts():
    service = _directives(UNIT.read_text())["Service"]
    # SIGTERM to the router alone: bitroute run finishes the batch in progress (exit 0).
    assert (service["KillMode"], service["KillSignal"]) == ("mixed", "SIGTERM")
    assert service["Restart"] == "on-failure" and float(service["RestartSec"]) >= 5
    assert float(service["TimeoutStopSec"]) >= 60
    assert service["EnvironmentFile"] == "/etc/bitroute/bitroute.env"
    assert f"{ENV_FILE.relative_to(FOLDER.parents[1])} {service['EnvironmentFile']}" in (
        UNIT.read_text())


def test_systemd_accepts_the_unit(tmp_path):
    """systemd-analyze verify, with ExecStart pointed at this checkout's bitroute (the
    unit's /opt/bitroute is not installed here)."""
    bitroute = Path(sys.executable).parent / "bitroute"
    assert bitroute.exists()
    unit = tmp_path / "bitroute.service"
    unit.write_text(UNIT.read_text().replace("/opt/bitroute/bin/bitroute", str(bitroute)))
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr
