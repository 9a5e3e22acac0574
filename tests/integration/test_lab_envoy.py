"""The lab's data plane pieces, for real: the Envoy bootstrap and an envoy-eds rendering
validated by the real Envoy binary (`--mode validate` rejects unknown fields and bad
values), and the lab's HTTP/1.1 servers answering from inside a lab namespace."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from azprobe.consumers.envoy import atomic_write, parse_endpoints, render_bytes
from azprobe.dev.lab.envoy import CLUSTER, envoy_binary, render_bootstrap
from tests.helpers import sample_weights_doc


def validate(bootstrap: dict, tmp_path) -> subprocess.CompletedProcess:
    path = tmp_path / "bootstrap.json"
    path.write_text(json.dumps(bootstrap))
    return subprocess.run([str(envoy_binary()), "--mode", "validate", "-c", str(path), "--disable-hot-restart"],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("outlier", [False, True])
def test_real_envoy_accepts_the_lab_bootstrap(tmp_path, outlier):
    eds = tmp_path / "eds.json"
    endpoints = parse_endpoints({"az-a": ["198.18.1.2:8080"], "az-b": ["198.18.2.2:8080"]}, "test")
    # a drained az-b: the rendering carries a priority-1 locality
    atomic_write(eds, render_bytes(CLUSTER, endpoints, sample_weights_doc(3, {"az-a": 99, "az-b": 1})))
    assert '"priority": 1' in eds.read_text()
    result = validate(render_bootstrap(eds, node_id="test", outlier_detection=outlier), tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def test_real_envoy_rejects_a_misspelt_field(tmp_path):
    eds = tmp_path / "eds.json"
    eds.write_text("{}")
    bootstrap = render_bootstrap(eds, node_id="test")
    bootstrap["static_resources"]["clusters"][0]["locality_weighted_lb_confg"] = {}
    result = validate(bootstrap, tmp_path)
    assert result.returncode != 0 and "locality_weighted_lb_confg" in result.stdout + result.stderr


@pytest.mark.lab
def test_lab_serves_http11_in_every_az_naming_the_az(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: network namespaces")
    from azprobe.dev.lab.lab import Lab, LabSpec, unique_lab_name
    from azprobe.dev.lab.topology import HTTP_PORT

    script = ("import http.client, sys\n"
              "c = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]), timeout=5)\n"
              "for path in ('/', '/healthz'):\n"  # two requests on one keep-alive connection
              "    c.request('GET', path); r = c.getresponse(); body = r.read()\n"
              "    print(r.version, r.status, r.getheader('x-az'), body.decode().strip())\n")
    with Lab.up(LabSpec(name=unique_lab_name("http"), state_dir=tmp_path / "lab", traffic=False)) as lab:
        for az in lab.azs:
            out = lab.exec(lab.client_ns("az-a"), ["python3", "-c", script, lab.server_addr(az), str(HTTP_PORT)])
            assert out.stdout.splitlines() == [f"11 200 {az} {az}"] * 2, out.stdout
