"""deploy/kubernetes/bitroute.yaml, checked without a cluster: it parses, the router
accepts every setting it passes, and its objects agree with one another (a rename in one
place that misses another is what breaks a manifest nobody can apply here)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from streaming.config import ENV_PREFIX, load, parse_set_flags

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "bitroute.yaml"


@pytest.fixture(scope="module")
def objects() -> dict[str, dict]:
    documents = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    by_kind = {d["kind"]: d for d in documents}
    assert len(by_kind) == len(documents), "one object of each kind"
    return by_kind


@pytest.fixture(scope="module")
def router(objects) -> dict:
    [container] = objects["Deployment"]["spec"]["template"]["spec"]["containers"]
    return container


def _sets(router: dict) -> list[str]:
    args = router["args"]
    assert args[:2] == ["bitroute", "run"]
    flags = args[2:]
    assert flags[0::2] == ["--set"] * (len(flags) // 2) and len(flags) % 2 == 0
    return flags[1::2]


def _env(router: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in router["env"] if "value" in e}


def test_the_router_accepts_every_setting_the_manifest_passes(router):
    sets = [s.replace("$(POD_NAME)", "bitroute-router-0") for s in _sets(router)]
    environ = {name: value for name, value in _env(router).items() if name.startswith(ENV_PREFIX)}
    config = load(overrides=parse_set_flags(sets), environ=environ)
    assert config.spark.master.startswith("k8s://")
    assert config.kafka.replication_factor == 3 and config.kafka.min_insync_replicas == 2
    assert str(config.streaming.checkpoint_dir) == "/data/checkpoints"
    assert (config.metrics.host, config.metrics.port) == ("0.0.0.0", 9464)


def test_one_router_replica_replaced_not_rolled(objects):
    spec = objects["Deployment"]["spec"]
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"


def test_the_driver_service_selects_the_router_pod_on_its_ports(objects, router):
    service = objects["Service"]
    pod = objects["Deployment"]["spec"]["template"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    container_ports = {p["containerPort"] for p in router["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} == container_ports
    settings = dict(s.split("=", 1) for s in _sets(router))
    assert {int(settings["spark.options.spark.driver.port"]),
            int(settings["spark.options.spark.driver.blockManager.port"]),
            int(settings["metrics.port"])} == container_ports
    namespace = objects["Namespace"]["metadata"]["name"]
    assert settings["spark.options.spark.driver.host"] == (
        f"{service['metadata']['name']}.{namespace}.svc.cluster.local")
    annotations = pod["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == int(settings["metrics.port"])


def test_the_checkpoint_folder_is_the_claimed_volume(objects, router):
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    [mount] = router["volumeMounts"]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["persistentVolumeClaim"]["claimName"] == (
        objects["PersistentVolumeClaim"]["metadata"]["name"])
    assert mount["mountPath"] == _env(router)["BITROUTE_STREAMING_CHECKPOINT_DIR"]


def test_credentials_come_from_the_secret_never_from_the_command_line(objects, router):
    secret = objects["Secret"]
    keys = set(secret["stringData"])
    assert [s["secretRef"]["name"] for s in router["envFrom"]] == [secret["metadata"]["name"]]
    refs = [s.split("=", 1)[1] for s in _sets(router) if ".secretKeyRef." in s]
    assert refs and all(ref.split(":")[0] == secret["metadata"]["name"]
                        and ref.split(":")[1] in keys for ref in refs)
    # A secret's name on the command line only as a reference to the Secret.
    assert all(".secretKeyRef." in arg for arg in router["args"] if any(k in arg for k in keys))


def test_the_driver_may_manage_its_executor_pods(objects):
    [rule] = objects["Role"]["rules"]
    assert {"pods", "configmaps", "services"} <= set(rule["resources"])
    assert {"create", "delete", "watch", "list"} <= set(rule["verbs"])
    binding = objects["RoleBinding"]
    assert binding["roleRef"]["name"] == objects["Role"]["metadata"]["name"]
    assert [s["name"] for s in binding["subjects"]] == [objects["ServiceAccount"]["metadata"]["name"]]
    account = objects["Deployment"]["spec"]["template"]["spec"]["serviceAccountName"]
    assert account == objects["ServiceAccount"]["metadata"]["name"]
