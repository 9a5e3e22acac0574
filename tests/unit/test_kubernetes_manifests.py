"""deploy/kubernetes/ validates against the newest Kubernetes schemas kubernetes-validate
ships (strict: an unknown field fails), keeps every container as tight as the systemd
units, and docs/scheduler.md's KubeSchedulerConfiguration uses only field names of the
upstream v1 Extender type."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from azprobe.consumers.scheduler.server import FILTER, PRIORITIZE

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
UPSTREAM_FIELDS = ROOT / "tests" / "data" / "kube_scheduler_v1_extender_fields.txt"
SCHEDULER_DOC = ROOT / "docs" / "scheduler.md"


def newest_version() -> str:
    return kubernetes_validate.latest_version()


def documents() -> list[tuple[str, dict[str, Any]]]:
    return [(f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc)
            for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in documents() if doc["kind"] == kind]


def test_there_are_manifests_for_every_role() -> None:
    names = {name.split(":")[1] for name, _ in documents()}
    assert {"DaemonSet/azprobe-agent-az-a", "Deployment/azprobe-controller", "Deployment/azprobe-scheduler-extender",
            "Service/azprobe-scheduler-extender", "NetworkPolicy/azprobe-agent-from-controller",
            "ConfigMap/azprobe-xds", "Deployment/azprobe-xds", "Service/azprobe-xds"} <= names
    assert tuple(int(p) for p in newest_version().split(".")[:2]) >= (1, 37)


@pytest.mark.parametrize("name,doc", documents(), ids=[n for n, _ in documents()])
def test_every_manifest_validates_strictly(name: str, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, newest_version(), strict=True)


def test_the_validation_catches_an_unknown_field() -> None:
    doc = by_kind("Deployment")[0]
    broken = yaml.safe_load(yaml.safe_dump(doc))
    broken["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, newest_version(), strict=True)


def pod_specs() -> list[tuple[str, dict[str, Any]]]:
    return [(doc["metadata"]["name"], doc["spec"]["template"]["spec"])
            for doc in by_kind("DaemonSet") + by_kind("Deployment")]


@pytest.mark.parametrize("name,spec", pod_specs(), ids=[n for n, _ in pod_specs()])
def test_every_container_is_locked_down(name: str, spec: dict[str, Any]) -> None:
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    for container in spec.get("initContainers", []) + spec["containers"]:
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, container["name"]
        assert sc["capabilities"]["drop"] == ["ALL"], container["name"]
        assert "privileged" not in sc


@pytest.mark.parametrize("name,spec", pod_specs(), ids=[n for n, _ in pod_specs()])
def test_a_non_root_container_can_read_its_secrets_and_nobody_else_can(name: str, spec: dict[str, Any]) -> None:
    """A Secret's files are root-owned: a non-root process reads one only through its
    group (fsGroup, mode 0440: what read_secret_file accepts, root-owned and our group)."""
    pod = spec["securityContext"]
    secrets = {v["name"]: v["secret"] for v in spec["volumes"] if "secret" in v}
    for container in spec.get("initContainers", []) + spec["containers"]:
        uid = container["securityContext"].get("runAsUser", pod.get("runAsUser"))
        mounted = [secrets[m["name"]] for m in container.get("volumeMounts", []) if m["name"] in secrets]
        for secret in mounted:
            mode = secret.get("defaultMode", 0o644)
            if uid == 0 or mode & 0o004:  # root, or a file the container's script reads as anyone
                continue
            assert mode == 0o440 and pod.get("fsGroup") == pod.get("runAsGroup") is not None, \
                (container["name"], secret["secretName"], oct(mode), pod)


def test_the_agent_has_exactly_the_capabilities_of_its_unit() -> None:
    unit = (ROOT / "systemd" / "azprobe-agent.service").read_text()
    bounding = re.search(r"^CapabilityBoundingSet=(.*)$", unit, re.M)[1].split()  # type: ignore[index]
    for daemonset in by_kind("DaemonSet"):
        spec = daemonset["spec"]["template"]["spec"]
        assert spec["hostNetwork"] is True
        agent = spec["containers"][0]
        assert ["CAP_" + cap for cap in agent["securityContext"]["capabilities"]["add"]] == bounding
        mounts = {m["mountPath"] for m in agent["volumeMounts"]}
        assert {"/sys/kernel/btf", "/sys/kernel/tracing", "/lib/modules"} <= mounts
        zone = spec["nodeSelector"]["topology.kubernetes.io/zone"]
        assert next(m for m in agent["volumeMounts"] if m["mountPath"] == "/etc/azprobe/agent.toml")["subPath"] \
            == f"{zone}.toml"
    for spec in (d["spec"]["template"]["spec"] for d in by_kind("Deployment")):
        assert "add" not in spec["containers"][0]["securityContext"]["capabilities"]


def test_the_agent_configs_load_with_the_agents_loader(tmp_path: Path) -> None:
    from azprobe.agent.config import parse_agent_config
    from azprobe.config import parse_toml

    config_map = next(d for d in by_kind("ConfigMap") if d["metadata"]["name"] == "azprobe-agent")
    for key, text in config_map["data"].items():
        if key.endswith(".toml"):
            data = parse_toml(text.encode(), key)
            data["agent"].pop("token_file")  # a Secret on the cluster
            assert parse_agent_config(data).az == key.removesuffix(".toml")


def test_the_controller_and_extender_configs_load() -> None:
    from azprobe.config import parse_toml
    from azprobe.consumers.scheduler.config import parse_extender_config
    from azprobe.controller.config import parse_config

    maps = {d["metadata"]["name"]: d["data"] for d in by_kind("ConfigMap")}
    controller = parse_toml(maps["azprobe-controller"]["controller.toml"].encode(), "controller")
    controller["agents"].pop("token_file")
    assert parse_config(controller).agents.discover == "consul"
    extender = parse_extender_config(parse_toml(maps["azprobe-scheduler-extender"]["scheduler-extender.toml"]
                                                .encode(), "extender"))
    assert extender.extender.listen[1] == 9746


def test_the_extender_reads_its_tls_files_from_secret_volumes_it_can_follow() -> None:
    from azprobe.config import parse_toml
    from azprobe.consumers.scheduler.config import parse_extender_config

    config_map = next(d for d in by_kind("ConfigMap") if d["metadata"]["name"] == "azprobe-scheduler-extender")
    settings = parse_extender_config(parse_toml(config_map["data"]["scheduler-extender.toml"].encode(),
                                                "extender")).extender
    files = (settings.tls_cert_file, settings.tls_key_file, settings.tls_ca_file)
    assert all(files), files
    deployment = next(d for d in by_kind("Deployment") if d["metadata"]["name"] == "azprobe-scheduler-extender")
    spec = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = spec["containers"][0]["volumeMounts"]
    for path in files:
        (mount,) = [m for m in mounts if path.startswith(m["mountPath"].rstrip("/") + "/")]
        # A subPath mount never sees a Secret's update: the rotation would need a restart.
        assert "subPath" not in mount and mount["readOnly"] is True, mount
        assert "secret" in volumes[mount["name"]], mount["name"]
    key_mount = next(m for m in mounts if settings.tls_key_file.startswith(m["mountPath"] + "/"))
    assert volumes[key_mount["name"]]["secret"]["defaultMode"] == 0o440
    # With a client CA the kubelet's probes (no client certificate) cannot get /healthz.
    container = spec["containers"][0]
    assert container["readinessProbe"]["tcpSocket"] == {"port": settings.listen[1]}


def test_the_xds_config_loads_and_the_service_reaches_its_ports() -> None:
    from azprobe.config import parse_toml
    from azprobe.consumers.xds.config import parse_xds_config

    config_map = next(d for d in by_kind("ConfigMap") if d["metadata"]["name"] == "azprobe-xds")
    settings = parse_xds_config(parse_toml(config_map["data"]["xds.toml"].encode(), "xds"))
    assert settings.metrics_listen is not None
    deployment = next(d for d in by_kind("Deployment") if d["metadata"]["name"] == "azprobe-xds")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:2] == ["xds", "serve"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": int(settings.listen.rsplit(":", 1)[1]), "http": settings.metrics_listen[1]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": settings.metrics_listen[1]}
    # The drain must end before the kubelet kills the pod.
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > settings.drain_s + 1
    service = next(d for d in by_kind("Service") if d["metadata"]["name"] == "azprobe-xds")
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)


def test_the_controller_runs_three_replicas() -> None:
    controller = next(d for d in by_kind("Deployment") if d["metadata"]["name"] == "azprobe-controller")
    assert controller["spec"]["replicas"] == 3


def test_only_the_controller_reaches_the_agents() -> None:
    policy = next(d for d in by_kind("NetworkPolicy") if d["metadata"]["name"] == "azprobe-agent-from-controller")
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "azprobe-agent"}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "azprobe-controller"}}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9740}]


# --- docs/scheduler.md's KubeSchedulerConfiguration ---------------------------------------

def upstream_fields() -> dict[str, set[str]]:
    fields: dict[str, set[str]] = {}
    current = ""
    for line in UPSTREAM_FIELDS.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            current = line.strip("[]")
            fields[current] = set()
        else:
            fields[current].add(line.strip())
    return fields


def scheduler_configuration() -> dict[str, Any]:
    blocks = re.findall(r"```yaml\n(.*?)```", SCHEDULER_DOC.read_text(), re.S)
    configs = [doc for doc in map(yaml.safe_load, blocks) if doc.get("kind") == "KubeSchedulerConfiguration"]
    assert len(configs) == 1
    return configs[0]


def test_the_scheduler_configuration_uses_upstream_field_names() -> None:
    fields = upstream_fields()
    assert "urlPrefix" in fields["Extender"] and "caData" in fields["ExtenderTLSConfig"]
    config = scheduler_configuration()
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    (entry,) = config["extenders"]
    assert set(entry) <= fields["Extender"], set(entry) - fields["Extender"]
    assert set(entry.get("tlsConfig", {})) <= fields["ExtenderTLSConfig"]
    for resource in entry.get("managedResources", []):
        assert set(resource) <= fields["ExtenderManagedResource"]
    assert {"urlPrefix", "filterVerb", "prioritizeVerb", "weight", "nodeCacheCapable", "httpTimeout",
            "ignorable"} <= set(entry)


def test_the_scheduler_configuration_matches_the_extender() -> None:
    (entry,) = scheduler_configuration()["extenders"]
    assert entry["ignorable"] is True
    assert (entry["filterVerb"], entry["prioritizeVerb"]) == (FILTER, PRIORITIZE)
    assert entry["urlPrefix"].endswith(":9746")
    assert isinstance(entry["weight"], int) and entry["weight"] > 0
    assert re.fullmatch(r"\d+(ms|s)", entry["httpTimeout"])


def test_a_wrong_field_name_would_be_caught() -> None:
    assert "nodeCachedCapable" not in upstream_fields()["Extender"]
    assert "ignoreable" not in upstream_fields()["Extender"]
