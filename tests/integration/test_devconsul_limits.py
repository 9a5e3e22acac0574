"""devconsul as Consul does it: lock-delay clamped to 60 s, bad or overflowing durations
answered 400 (never a 500 with a traceback), a per-client cap on concurrent requests, a
body-read timeout, the ACL master token kept off argv, a prompt exit on SIGTERM while
blocking queries are parked, and /v1/agent/self with the fields clients read."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import consul
import pytest

from azprobe.dev.devconsul.testing import DevConsul
from tests.helpers import child_url, write_secret

HUGE = "1" + "0" * 400 + "s"  # overflows float and int64: Go's ParseDuration says "invalid duration"


def _session(dc, body: dict) -> tuple[int, bytes]:
    r = dc.request("PUT", "/v1/session/create", json.dumps(body))
    return r.status, r.body


def test_lock_delay_is_clamped_to_60s(devconsul):
    status, body = _session(devconsul, {"LockDelay": "1h", "TTL": "10s"})
    assert status == 200
    info = devconsul.request("GET", f"/v1/session/info/{json.loads(body)['ID']}")
    assert json.loads(info.body)[0]["LockDelay"] == 60 * 10**9


@pytest.mark.parametrize("body", [{"TTL": HUGE}, {"TTL": "abc"}, {"TTL": 5}, {"LockDelay": HUGE},
                                  {"LockDelay": 1e308}, {"LockDelay": -5}])
def test_bad_or_overflowing_durations_are_400(devconsul, body):
    status, text = _session(devconsul, body)
    assert status == 400, text
    assert b"Traceback" not in text and len(text) < 300


@pytest.mark.parametrize("wait", [HUGE, "10x"])
def test_bad_or_overflowing_wait_is_400(devconsul, wait):
    devconsul.request("PUT", "/v1/kv/k", "v")
    r = devconsul.request("GET", f"/v1/kv/k?index=1&wait={wait}")
    assert r.status == 400 and b"Traceback" not in r.body


def test_per_client_cap_on_concurrent_requests(tmp_path):
    with DevConsul(data_dir=tmp_path / "dc", max_conns_per_client=3) as dc:
        dc.request("PUT", "/v1/kv/k", "v")
        index = dc.request("GET", "/v1/kv/k").headers["X-Consul-Index"]
        parked = []
        for _ in range(3):  # three blocking queries hold the client's three slots
            s = socket.create_connection((dc.host, dc.port))
            s.sendall(f"GET /v1/kv/k?index={index}&wait=30s HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            parked.append(s)
        deadline = time.monotonic() + 10
        while dc.request("GET", "/v1/status/leader").status != 429:
            assert time.monotonic() < deadline
        for s in parked:
            s.close()
        while dc.request("GET", "/v1/status/leader").status != 200:  # slots freed with the connections
            assert time.monotonic() < deadline


def test_a_body_that_never_arrives_is_cut(devconsul, monkeypatch):
    s = socket.create_connection((devconsul.host, devconsul.port))
    s.sendall(b"PUT /v1/kv/slow HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
    s.settimeout(30)
    answer = s.recv(4096)
    s.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:80]


def test_acl_master_token_comes_from_a_file_or_the_environment(tmp_path):
    token_file = write_secret(tmp_path / "token", "file-secret\n")
    address_file = tmp_path / "devconsul.addr"
    proc = subprocess.Popen([sys.executable, "-m", "azprobe.dev.devconsul", "--http-addr", "127.0.0.1:0",
                             "--address-file", str(address_file), "--acl-master-token-file", str(token_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        line = proc.stdout.readline().decode()
        port = int(child_url(address_file, proc).rsplit(":", 1)[1])
        assert "acl on" in line
        assert b"file-secret" not in open(f"/proc/{proc.pid}/cmdline", "rb").read()
        c = consul.Consul(host="127.0.0.1", port=port, token="file-secret")
        c.kv.put("x", "1")
        with pytest.raises(consul.ACLPermissionDenied):
            consul.Consul(host="127.0.0.1", port=port).kv.put("x", "2")
    finally:
        proc.terminate()
        proc.wait(10)
    with DevConsul(data_dir=tmp_path / "env", acl_master_token="env-secret") as dc:
        assert b"env-secret" not in open(f"/proc/{dc.pid}/cmdline", "rb").read()
        assert dc.request("PUT", "/v1/kv/y", "1", headers={"X-Consul-Token": "env-secret"}).status == 200
    old = subprocess.run([sys.executable, "-m", "azprobe.dev.devconsul", "--acl-master-token", "argv-secret"],
                         capture_output=True, timeout=30)
    assert old.returncode == 2  # no such option: a token on argv is refused
    token_file.chmod(0o644)
    loose = subprocess.run([sys.executable, "-m", "azprobe.dev.devconsul", "--http-addr", "127.0.0.1:0",
                            "--acl-master-token-file", str(token_file)], capture_output=True, text=True, timeout=30)
    assert loose.returncode == 2 and f"has mode 0644: other users may read or write it (chmod 600 {token_file})" \
        in loose.stderr


def test_sigterm_with_parked_queries_from_gone_clients_exits_promptly(tmp_path):
    dc = DevConsul(data_dir=tmp_path / "dc").start()
    try:
        dc.request("PUT", "/v1/kv/k", "v")
        index = dc.request("GET", "/v1/kv/k").headers["X-Consul-Index"]
        keep = socket.create_connection((dc.host, dc.port))  # a client still waiting
        keep.sendall(f"GET /v1/kv/k?index={index}&wait=60s HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        deadline = time.monotonic() + 10
        while dc.parked_queries() < 1:
            assert time.monotonic() < deadline
        for _ in range(5):  # and clients that park a long poll and go away
            s = socket.create_connection((dc.host, dc.port))
            s.sendall(f"GET /v1/kv/k?index={index}&wait=60s HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            s.close()
        proc = dc.proc
        proc.terminate()
        proc.wait(timeout=10)  # was ~62 s: every parked query waited out its `wait`
        assert proc.returncode == 0
        keep.settimeout(5)
        assert keep.recv(4096).startswith(b"HTTP/1.1 200")  # the parked one got its answer
        keep.close()
    finally:
        dc.close()


def test_agent_self_has_what_clients_read(devconsul):
    doc = json.loads(devconsul.request("GET", "/v1/agent/self").body)
    assert {"Datacenter", "NodeName", "NodeID", "Version", "Server"} <= set(doc["Config"])
    assert {"Name", "Addr", "Port", "Tags", "Status"} <= set(doc["Member"])
    consul_stats = doc["Stats"]["consul"]
    assert consul_stats["leader"] == "true" and consul_stats["leader_addr"].endswith(":8300")
    assert {"agent", "build", "raft", "runtime", "serf_lan"} <= set(doc["Stats"])
    assert consul.Consul(host=devconsul.host, port=devconsul.port).agent.self()["Stats"]["consul"]["leader_addr"]
