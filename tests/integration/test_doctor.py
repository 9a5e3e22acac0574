"""`azprobe doctor` as an operator runs it: the real kernel for the agent role, a real
devconsul (with and without ACLs) for the controller role."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from azprobe.dev.devconsul.testing import DevConsul
from tests.helpers import refused_port, require_tools, write_secret

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
    server = ThreadingHTTPServer(("127.0.0.1", 0), HealthzOnly)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


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
