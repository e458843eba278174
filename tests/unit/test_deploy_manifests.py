"""deploy/k8s/ and deploy/compose.yaml: structure (images, probes, resources, scaling on
the consumer groups of schemas/topics.py, the sandbox-worker egress policy), the ConfigMap's
rollstream.toml as valid settings, and `kubectl apply --dry-run=client --validate=false`
when a kubectl is installed (KUBECTL picks one; against a discovery stand-in)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from schemas import topics
from services.settings import load
from tests.unit.k8s_discovery import discovery_server

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
SCALED = {"generator": topics.GENERATORS, "dispatcher": topics.DISPATCHER}
SCALED["sandbox-worker"] = topics.SANDBOX_WORKERS
CONSUMED = {"generator": topics.TASKS, "dispatcher": topics.TRAJECTORIES}
CONSUMED["sandbox-worker"] = topics.SANDBOX_REQUESTS
METRICS = {
    "generator": ("generator", "metrics_port"),
    "dispatcher": ("dispatcher", "metrics_port"),
    "sandbox-worker": ("sandbox", "worker_metrics_port"),
    "learner": ("learner", "metrics_port"),
}


def _docs() -> list[dict[str, Any]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        out += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in _docs() if d["kind"] == kind}


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Any:
    (cm,) = _by_kind("ConfigMap").values()
    path = tmp_path_factory.mktemp("cm") / "rollstream.toml"
    path.write_text(cm["data"]["rollstream.toml"])
    return load(config=path)


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return container


def test_every_workload_runs_the_rollstream_image_with_resources_and_config() -> None:
    workloads = {**_by_kind("Deployment"), **_by_kind("StatefulSet")}
    assert set(workloads) == {"generator", "dispatcher", "sandbox-worker", "feeder", "learner"}
    for name, w in workloads.items():
        c = _container(w)
        assert c["image"] == "rollstream", name
        assert c["args"][0] == ("sandbox-worker" if name == "sandbox-worker" else name)
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"][kind]), (name, kind)
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["ROLLSTREAM_CONFIG"] == "/etc/rollstream/rollstream.toml", name
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert mounts["config"] == "/etc/rollstream", name
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert w["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_probes_ask_each_service_its_metrics_port(config: Any) -> None:
    workloads = {**_by_kind("Deployment"), **_by_kind("StatefulSet")}
    for name, (section, field) in METRICS.items():
        port = getattr(getattr(config, section), field)
        assert port > 0, f"{section}.{field} must be on for the probes"
        c = _container(workloads[name])
        assert [p["containerPort"] for p in c["ports"]] == [port], name
        for probe in ("readinessProbe", "livenessProbe"):
            command = " ".join(c[probe]["exec"]["command"])
            assert f"http://127.0.0.1:{port}/metrics" in command, (name, probe)
            assert c[probe]["timeoutSeconds"] < c[probe]["periodSeconds"]


def test_scaled_objects_follow_consumer_lag_of_the_registry_groups(config: Any) -> None:
    scaled = _by_kind("ScaledObject")
    assert set(scaled) == set(SCALED)
    prefix = config.topics.prefix
    for name, so in scaled.items():
        assert so["apiVersion"] == "keda.sh/v1alpha1"
        assert so["spec"]["scaleTargetRef"]["name"] == name
        (trigger,) = so["spec"]["triggers"]
        assert trigger["type"] == "kafka"
        meta = trigger["metadata"]
        assert meta["consumerGroup"] == SCALED[name].full_id(prefix), name
        assert meta["topic"] == CONSUMED[name].full_name(prefix), name
        assert CONSUMED[name] in SCALED[name].consumes
        assert int(meta["lagThreshold"]) > 0
        assert meta["bootstrapServers"] == config.kafka.bootstrap
        # More replicas than partitions would sit idle in the group.
        parts = CONSUMED[name].partition_count(config.topics.partitions)
        assert 1 <= so["spec"]["minReplicaCount"] <= so["spec"]["maxReplicaCount"] <= parts


def test_learner_is_one_stateful_replica_with_a_checkpoint_volume(config: Any) -> None:
    learner = _by_kind("StatefulSet")["learner"]
    assert learner["spec"]["replicas"] == 1
    (claim,) = learner["spec"]["volumeClaimTemplates"]
    mount = {m["name"]: m["mountPath"] for m in _container(learner)["volumeMounts"]}
    assert config.learner.checkpoint_dir is not None
    assert str(config.learner.checkpoint_dir).startswith(mount[claim["metadata"]["name"]])
    assert str(config.stack.state_dir).startswith(mount[claim["metadata"]["name"]])


def test_sandbox_worker_egress_only_to_kafka_redis_and_dns(config: Any) -> None:
    (policy,) = _by_kind("NetworkPolicy").values()
    spec = policy["spec"]
    worker = _by_kind("Deployment")["sandbox-worker"]
    assert spec["podSelector"]["matchLabels"] == worker["spec"]["selector"]["matchLabels"]
    assert spec["policyTypes"] == ["Egress"]
    allowed = set()
    for rule in spec["egress"]:
        assert rule["to"] and rule["ports"], "a rule without peers or ports allows everything"
        for peer in rule["to"]:
            assert "ipBlock" not in peer
            app = peer["podSelector"]["matchLabels"]
            allowed |= {(app.get("app.kubernetes.io/name") or app["k8s-app"], p["port"])
                        for p in rule["ports"]}  # fmt: skip
    redis_port = int(config.redis.url.rsplit(":", 1)[1].split("/")[0])
    kafka_ports = {int(h.rsplit(":", 1)[1]) for h in config.kafka.bootstrap.split(",")}
    assert allowed == {("kafka", p) for p in kafka_ports} | {("redis", redis_port)} | {
        ("kube-dns", 53)
    }


def test_sandbox_workers_use_the_node_docker_engine(config: Any) -> None:
    spec = _by_kind("Deployment")["sandbox-worker"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    sock = config.docker.host.removeprefix("unix://")
    assert volumes["docker-sock"]["hostPath"] == {"path": sock, "type": "Socket"}
    (container,) = spec["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["docker-sock"] == sock
    assert config.docker.install is False


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "Kustomization").read_text())
    assert set(kustomization["resources"]) == {p.name for p in K8S.glob("*.yaml")}


def test_compose_runs_the_whole_pipeline() -> None:
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    services = compose["services"]
    brokers = [n for n in services if n.startswith("kafka-")]
    assert len(brokers) == 3
    for role in ("generator", "dispatcher", "sandbox-worker"):
        assert len([n for n in services if n.startswith(role)]) >= 2, role
    assert {"redis", "feeder", "learner"} <= set(services)
    for name, svc in services.items():
        # One image for all (upstream Kafka/Redis images by variable, where they can be pulled).
        assert svc["image"].endswith(":-rollstream:0.1.0}"), name
    for name in brokers:
        env = services[name]["environment"]
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{name}:9092"
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
        voters = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")
        assert [v.split("@")[1] for v in voters] == [f"{b}:9093" for b in brokers]
    bootstrap = services["feeder"]["environment"]["ROLLSTREAM__KAFKA__BOOTSTRAP"]
    assert bootstrap == ",".join(f"{b}:9092" for b in brokers)
    for name in (n for n in services if n.startswith("sandbox-worker")):
        assert "/var/run/docker.sock:/var/run/docker.sock" in services[name]["volumes"]


def _kubectl() -> str | None:
    return os.environ.get("KUBECTL") or shutil.which("kubectl")


@pytest.mark.skipif(_kubectl() is None, reason="no kubectl installed")
def test_kubectl_client_dry_run_accepts_the_manifests() -> None:
    kubectl = _kubectl()
    assert kubectl is not None
    with discovery_server() as url:
        out = subprocess.run(
            [kubectl, "--server", url, "apply", "--dry-run=client", "--validate=false",
             "-f", str(K8S)],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "KUBECONFIG": "/dev/null"},
        )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    created = [line for line in out.stdout.splitlines() if line.endswith("(dry run)")]
    assert len(created) == len(_docs())
