"""`azprobe lab envoy`: run a real Envoy in a lab client namespace, fed by a file-EDS
resource that `azprobe envoy-eds --watch` can keep in step with Consul KV."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from azprobe.dev.lab.topology import DEFAULT_NAME, HTTP_PORT


@click.command("envoy")
@click.option("--az", default="az-a", show_default=True, help="Client AZ whose namespace runs Envoy.")
@click.option("--outlier-detection", is_flag=True, help="Add the drill's envoy-outlier settings.")
@click.option("--name", default=DEFAULT_NAME, show_default=True, help="Lab name.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The lab's state dir [default: /run/azprobe-lab, or /run/azprobe-lab-NAME].")
def envoy_command(az: str, outlier_detection: bool, name: str, state_dir: Path | None) -> None:
    """Run Envoy (foreground) in AZ's client namespace: listener 127.0.0.1:10000, admin
    127.0.0.1:9901, both inside the namespace; EDS from <state-dir>/envoy/eds.json."""
    from azprobe.consumers.envoy import atomic_write, parse_endpoints, render_bytes
    from azprobe.dev.lab.cli import _load
    from azprobe.dev.lab.envoy import CLUSTER, envoy_binary, render_bootstrap

    lab = _load(name, state_dir)
    ns = lab.client_ns(az)
    work = lab.state_dir / "envoy"
    work.mkdir(parents=True, exist_ok=True)
    endpoints = {zone: [f"{addr}:{HTTP_PORT}" for addr in lab.server_addrs(zone)] for zone in lab.azs}
    endpoints_path, eds = work / "endpoints.json", work / "eds.json"
    endpoints_path.write_text(json.dumps(endpoints, indent=2))
    if not eds.exists():  # equal weights until envoy-eds writes the file
        atomic_write(eds, render_bytes(CLUSTER, parse_endpoints(endpoints, str(endpoints_path)), None))
    bootstrap = work / f"bootstrap-{az}.json"
    bootstrap.write_text(json.dumps(render_bootstrap(eds, node_id=f"{ns}-envoy",
                                                     outlier_detection=outlier_detection), indent=2))
    click.echo(f"Envoy in {ns}: http://127.0.0.1:10000 -> cluster {CLUSTER}, admin 127.0.0.1:9901 (inside {ns})\n"
               f"keep its EDS in step with KV:  azprobe envoy-eds --cluster {CLUSTER} --endpoints {endpoints_path} "
               f"--out {eds} --watch\n"
               f"send a request:  ip netns exec {ns} curl -s http://127.0.0.1:10000/", err=True)
    argv = ["ip", "netns", "exec", ns, str(envoy_binary()), "-c", str(bootstrap), "--concurrency", "1",
            "--disable-hot-restart", "--log-level", "warn"]
    os.execvp(argv[0], argv)
