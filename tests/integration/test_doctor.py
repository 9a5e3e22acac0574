"""`azprobe doctor` as an operator runs it: the real kernel for the agent role, a real
devconsul (with and without ACLs) for the controller role."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from azprobe.dev.devconsul.testing import DevConsul
from tests.helpers import refused_port, require_tools, serve_http, write_secret

ROOT = Path(__file__).resolve().parents[2]


def doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CONSUL_HTTP")}
    return subprocess.run([sys.executable, "-m", "azprobe.commands.cli", "doctor", *args], capture_output=True,
                          text=True, timeout=120, env={**base, **(env or {})}, cwd=ROOT)


def by_name(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


class HealthzOnly(BaseHTTPRequestHandler):
    """Stands in for an agent: doctor only asks an agent for /healthz."""

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def live_agent_url():
    with serve_http(HealthzOnly) as url:
        yield url


def controller_config(tmp_path: Path, address: str, agents: list[str], token_file: str = "") -> str:
    path = tmp_path / "controller.toml"
    quoted = ", ".join(f'"{a}"' for a in agents)
    path.write_text(f'[controller]\nname = "doctor-test"\n'
                    f'[consul]\naddress = "{address}"\ntoken_file = "{token_file}"\nprefix = "azprobe/test/"\n'
                    f'[agents]\nstatic = [{quoted}]\n[topology]\nazs = ["az-a"]\n')
    return str(path)


# --- agent role: this machine ---------------------------------------------------------

@pytest.mark.kernel  # root, BTF, tracefs, bcc: the conftest checks them (fails under CI)
def test_agent_role_passes_on_this_machine(tmp_path):
    config = tmp_path / "agent.toml"
    config.write_text('[node]\naz = "az-a"\n[topology]\naz-a = ["198.18.1.0/24"]\n')
    result = doctor("--role", "agent", "--config", str(config), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    checks = by_name(report)
    assert report["ok"] is True and report["role"] == "agent"
    for name in ("config", "kernel.btf", "tracefs", "tracepoint tcp:tcp_probe", "tracepoint tcp:tcp_retransmit_skb",
                 "tracepoint tcp:tcp_cong_state_set", "tracepoint tcp:tcp_receive_reset",
                 "tracepoint sock:inet_sock_set_state", "kernel.headers", "capabilities", "bcc.import",
                 "bcc.compile"):
        assert checks[name]["status"] == "ok", checks[name]


@pytest.mark.kernel
def test_agent_role_without_bpf_capabilities_fails_with_the_fix():
    require_tools("setpriv")
    # The same host, with the capabilities the unit grants taken away.
    result = subprocess.run(["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--",
                             sys.executable, "-m", "azprobe.commands.cli", "doctor", "--role", "agent"],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 1
    assert "✗ capabilities: effective: none of CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN" in result.stdout
    assert "fix: run as root with CAP_BPF and CAP_PERFMON" in result.stdout
    assert "✗ bcc.compile" in result.stdout


def test_bad_config_is_exit_2_naming_the_field(tmp_path):
    config = tmp_path / "agent.toml"
    config.write_text('[node]\naz = "az-x"\n[topology]\naz-a = ["198.18.1.0/24"]\n')
    result = doctor("--role", "agent", "--config", str(config))
    assert result.returncode == 2
    assert result.stderr.strip().startswith("azprobe: node.az:")


def test_unknown_role_is_exit_2():
    assert doctor("--role", "scheduler").returncode == 2


# --- controller role: Consul ------------------------------------------------------------

def test_controller_role_passes_against_devconsul(devconsul, tmp_path, live_agent_url):
    with refused_port() as port:
        dead_agent = f"http://127.0.0.1:{port}"
        config = controller_config(tmp_path, devconsul.url, [live_agent_url, dead_agent])
        result = doctor("--role", "controller", "--config", config, "--json")
    report = json.loads(result.stdout)
    checks = by_name(report)
    assert result.returncode == 0, result.stdout
    for name in ("config", "consul.reachable", "consul.leader", "consul.clock_skew", "consul.acl_kv",
                 "consul.acl_session", f"agent {live_agent_url}"):
        assert checks[name]["status"] == "ok", checks[name]
    # One dead agent is a warning (the controller holds its zone), not a failure.
    assert checks[f"agent {dead_agent}"]["status"] == "warn"
    assert checks[f"agent {dead_agent}"]["fix"]
    # The probe key was cleaned up.
    import consul

    _, keys = consul.Consul(host=devconsul.host, port=devconsul.port).kv.get("azprobe/test/", recurse=True)
    assert keys is None


def test_wrong_consul_address_fails_with_the_fix(tmp_path, live_agent_url):
    with refused_port() as port:
        config = controller_config(tmp_path, f"http://127.0.0.1:{port}", [live_agent_url])
        result = doctor("--role", "controller", "--config", config)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    failed = next(i for i, line in enumerate(lines) if line.startswith("✗ consul.reachable"))
    assert lines[failed + 1].strip().startswith("fix: check consul.address")
    assert lines[-1].startswith("NOT ready")


def test_all_agents_down_is_a_failure(devconsul, tmp_path):
    with refused_port() as port:
        config = controller_config(tmp_path, devconsul.url, [f"http://127.0.0.1:{port}"])
        result = doctor("--role", "controller", "--config", config, "--json")
    assert result.returncode == 1
    assert by_name(json.loads(result.stdout))["agents"]["status"] == "fail"


def test_acl_wrong_token_reports_permission_denied(tmp_path, live_agent_url):
    with DevConsul(acl_master_token="root-secret") as dc:
        wrong = write_secret(tmp_path / "wrong.token", "not-the-token\n")
        result = doctor("--role", "controller", "--config",
                        controller_config(tmp_path, dc.url, [live_agent_url], str(wrong)), "--json")
        assert result.returncode == 1
        acl = by_name(json.loads(result.stdout))["consul.acl_kv"]
        assert acl["status"] == "fail"
        assert acl["detail"].startswith("permission denied writing azprobe/test/doctor/")
        assert 'key_prefix "azprobe/test/"' in acl["fix"]

        right = write_secret(tmp_path / "right.token", "root-secret\n")
        result = doctor("--role", "controller", "--config",
                        controller_config(tmp_path, dc.url, [live_agent_url], str(right)), "--json")
        assert result.returncode == 0, result.stdout
        assert by_name(json.loads(result.stdout))["consul.acl_session"]["status"] == "ok"


def test_xds_role_checks_config_listen_weights_and_catalog(devconsul, tmp_path):
    import json as _json

    from tests import xds_harness as xh
    from tests.helpers import sample_weights_doc

    body = {"Node": "n1", "Address": "198.18.1.10", "Service": {"ID": "api-1", "Service": "api", "Port": 8080}}
    assert devconsul.request("PUT", "/v1/catalog/register", _json.dumps(body)).status == 200
    assert devconsul.request("PUT", "/v1/kv/azprobe/v1/weights", sample_weights_doc(1).dumps()).status == 200
    config = xh.write_config(tmp_path, devconsul.url, services=[{"name": "api", "consul_service": "api"},
                                                                {"name": "none", "consul_service": "none"}],
                             topology={"az-a": ["198.18.1.0/24"]})
    result = doctor("--role", "xds", "--config", str(config), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    checks = {c["name"]: c for c in _json.loads(result.stdout)["checks"]}
    assert checks["config"]["status"] == "ok" and checks["grpc"]["status"] == "ok"
    assert checks["weights global"]["status"] == "ok"
    assert checks["weights az-a"]["status"] == "warn"  # absent: the view serves the global document
    assert checks["service api"]["status"] == "ok" and "1 passing" in checks["service api"]["detail"]
    assert checks["service none"]["status"] == "warn"
    assert "consul.acl_kv" not in checks  # the xDS server only reads


def test_xds_role_without_config_fails_and_a_bad_one_is_exit_2(tmp_path):
    assert doctor("--role", "xds").returncode == 1
    bad = tmp_path / "xds.toml"
    bad.write_text('[xds]\nlisten = "nope"\n')
    result = doctor("--role", "xds", "--config", str(bad))
    assert result.returncode == 2 and "xds.listen" in result.stderr


# --- extender role: the scheduler extender's config, TLS, listen address, weights ----------

def extender_config(tmp_path: Path, consul_url: str, extra: str = "", listen: str = "127.0.0.1:0") -> str:
    path = tmp_path / "scheduler-extender.toml"
    path.write_text(f'[extender]\nlisten = "{listen}"\n{extra}[consul]\naddress = "{consul_url}"\n'
                    '[nodes]\nname_patterns = ["(?P<zone>az-[a-c])-node-[0-9]+"]\n')
    return str(path)


def test_extender_role_checks_config_tls_listen_and_weights(devconsul, tmp_path):
    from tests.helpers import sample_weights_doc
    from tests.pki import TestCA

    ca = TestCA.create(tmp_path / "pki", "scheduler-ca")
    server = ca.issue("extender", ips=["127.0.0.1"])
    tls = f'tls_cert_file = "{server.cert_file}"\ntls_key_file = "{server.key_file}"\ntls_ca_file = "{ca.cert_file}"\n'
    config = extender_config(tmp_path, devconsul.url, tls)
    result = doctor("--role", "extender", "--config", config, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    checks = by_name(json.loads(result.stdout))
    assert {checks[n]["status"] for n in ("config", "nodes", "extender.tls", "extender.listen",
                                          "consul.reachable")} == {"ok"}
    assert "scheduler-ca.crt" in checks["extender.tls"]["detail"]
    assert checks["weights"]["status"] == "warn" and "absent" in checks["weights"]["detail"]
    assert "consul.acl_kv" not in checks  # the extender only reads

    assert devconsul.request("PUT", "/v1/kv/azprobe/v1/weights", sample_weights_doc(4).dumps()).status == 200
    checks = by_name(json.loads(doctor("--role", "extender", "--config", config, "--json").stdout))
    assert checks["weights"]["status"] == "ok" and "generation 4" in checks["weights"]["detail"]

    # A key others can read, and a taken port: each a failure with its fix, exit 1.
    os.chmod(server.key_file, 0o644)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = extender_config(tmp_path, devconsul.url, tls, listen=f"127.0.0.1:{taken.getsockname()[1]}")
        result = doctor("--role", "extender", "--config", busy, "--json")
    assert result.returncode == 1
    checks = by_name(json.loads(result.stdout))
    assert checks["extender.tls"]["status"] == "fail" and "chmod 600" in checks["extender.tls"]["fix"]
    assert "PRIVATE KEY" not in result.stdout
    assert checks["extender.listen"]["status"] == "fail" and "change extender.listen" in checks["extender.listen"]["fix"]


def test_extender_role_without_consul_or_config(tmp_path):
    with refused_port() as port:
        result = doctor("--role", "extender", "--config", extender_config(tmp_path, f"http://127.0.0.1:{port}"),
                        "--json")
    assert result.returncode == 1
    checks = by_name(json.loads(result.stdout))
    assert checks["consul.reachable"]["status"] == "fail" and "weights" not in checks
    assert doctor("--role", "extender").returncode == 1
    bad = tmp_path / "bad.toml"
    bad.write_text('[extender]\ntls_ca_file = "/etc/ca.crt"\n')
    result = doctor("--role", "extender", "--config", str(bad))
    assert result.returncode == 2 and "extender.tls_ca_file" in result.stderr
