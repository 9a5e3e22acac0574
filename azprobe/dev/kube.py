"""Kubernetes objects shaped as the API server serves them (what kube-scheduler forwards to
an extender), for the scheduler extender's tests, bench and drill: a Node of a cloud
node pool and a Pod of a Deployment, with the fields a real one has (conditions, images,
managed fields left out), and the ExtenderArgs kube-scheduler marshals around them
(k8s.io/kube-scheduler/extender/v1: no json tags, so the keys are the Go field names; a
nil pointer is `null`)."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

NODE_TEMPLATE: dict[str, Any] = {
    "metadata": {
        "name": "", "uid": "5b0c2e0e-6a1f-4d55-9a8e-3c3c0f6c2d11", "resourceVersion": "1843022",
        "creationTimestamp": "2026-11-30T08:14:02Z",
        "labels": {
            "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/instance-type": "m6i.xlarge",
            "beta.kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": "",
            "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "m6i.xlarge",
            "topology.kubernetes.io/region": "region-1", "topology.kubernetes.io/zone": "",
            "pool": "general",
        },
        "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                        "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
    },
    "spec": {"podCIDR": "10.244.3.0/24", "podCIDRs": ["10.244.3.0/24"],
             "providerID": "cloud:///region-1/i-0a1b2c3d4e5f60718"},
    "status": {
        "capacity": {"cpu": "4", "ephemeral-storage": "104845292Ki", "hugepages-2Mi": "0",
                     "memory": "16100728Ki", "pods": "58"},
        "allocatable": {"cpu": "3920m", "ephemeral-storage": "95551679124", "hugepages-2Mi": "0",
                        "memory": "15083896Ki", "pods": "58"},
        "conditions": [
            {"type": t, "status": s, "lastHeartbeatTime": "2026-12-02T00:40:11Z",
             "lastTransitionTime": "2026-11-30T08:14:02Z", "reason": r, "message": m}
            for t, s, r, m in (
                ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                ("Ready", "True", "KubeletReady", "kubelet is posting ready status"))
        ],
        "addresses": [{"type": "InternalIP", "address": "10.0.3.17"}, {"type": "Hostname", "address": ""}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {"machineID": "ec2d5d1c0d8f4f0f9d0e0f1a2b3c4d5e", "systemUUID": "ec2d5d1c-0d8f-4f0f-9d0e-0f1a2b3c4d5e",
                     "bootID": "0f6b7c1e-2d3a-4b5c-8d9e-0a1b2c3d4e5f", "kernelVersion": "6.1.112",
                     "osImage": "Linux", "containerRuntimeVersion": "containerd://1.7.22",
                     "kubeletVersion": "v1.34.1", "kubeProxyVersion": "", "operatingSystem": "linux",
                     "architecture": "amd64"},
        "images": [{"names": [f"registry.example/team/app-{i}@sha256:{i:064x}", f"registry.example/team/app-{i}:v{i}"],
                    "sizeBytes": 50_000_000 + i} for i in range(6)],
    },
}

POD_TEMPLATE: dict[str, Any] = {
    "metadata": {"name": "", "generateName": "web-7c9d8f6b5-", "namespace": "shop",
                 "uid": "9a3f4b2c-1d0e-4f5a-8b7c-6d5e4f3a2b1c", "resourceVersion": "1843101",
                 "creationTimestamp": "2026-12-02T00:41:07Z",
                 "labels": {"app": "web", "pod-template-hash": "7c9d8f6b5"},
                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7c9d8f6b5",
                                      "uid": "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901", "controller": True,
                                      "blockOwnerDeletion": True}]},
    "spec": {"containers": [{"name": "web", "image": "registry.example/team/web:v42",
                             "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                             "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}},
                             "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                             "imagePullPolicy": "IfNotPresent"}],
             "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
             "serviceAccountName": "default", "schedulerName": "default-scheduler",
             "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                            "whenUnsatisfiable": "ScheduleAnyway",
                                            "labelSelector": {"matchLabels": {"app": "web"}}}],
             "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                              "effect": "NoExecute", "tolerationSeconds": 300}],
             "priority": 0, "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority"},
    "status": {"phase": "Pending", "qosClass": "Burstable"},
}


def node_object(name: str, zone: str | None) -> dict[str, Any]:
    """A Node named `name` in `zone` (None: without any zone label)."""
    node = copy.deepcopy(NODE_TEMPLATE)
    labels = node["metadata"]["labels"]
    node["metadata"]["name"] = labels["kubernetes.io/hostname"] = name
    node["status"]["addresses"][1]["address"] = name
    if zone is None:
        del labels["topology.kubernetes.io/zone"]
    else:
        labels["topology.kubernetes.io/zone"] = zone
    return node


def pod_object(name: str = "web-7c9d8f6b5-x2kq9") -> dict[str, Any]:
    pod = copy.deepcopy(POD_TEMPLATE)
    pod["metadata"]["name"] = name
    return pod


def extender_args(pod: dict[str, Any], nodes: Sequence[dict[str, Any]] | None = None,
                  node_names: Sequence[str] | None = None) -> dict[str, Any]:
    """ExtenderArgs as kube-scheduler marshals it: `Nodes` without nodeCacheCapable,
    `NodeNames` with it, the other one null."""
    return {"Pod": pod, "Nodes": None if nodes is None else {"metadata": {}, "items": list(nodes)},
            "NodeNames": None if node_names is None else list(node_names)}


def extender_body(pod: dict[str, Any], nodes: Sequence[dict[str, Any]] | None = None,
                  node_names: Sequence[str] | None = None) -> bytes:
    return json.dumps(extender_args(pod, nodes, node_names), separators=(",", ":")).encode()
