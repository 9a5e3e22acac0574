"""devconsul as Consul does it: lock-delay clamped to 60 s, bad or overflowing durations
answered 400 (never a 500 with a traceback), a per-client cap on open connections that
never drops one already open, body caps counted as the body arrives (chunked too), a
bound on what a txn returns, a body-read timeout, the ACL master token kept off argv, a
prompt exit on SIGTERM while blocking queries are parked, and /v1/agent/self with the
fields clients read."""

from __future__ import annotations

import base64
import http.client
import json
import selectors
import socket
import subprocess
import sys
import time

import consul
import pytest

from azprobe.clients.transport import raise_file_limit
from azprobe.dev.devconsul.testing import DevConsul
from tests.helpers import child_url, wait_for, write_secret

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


def _raw(dc, request: bytes) -> socket.socket:
    s = socket.create_connection((dc.host, dc.port))
    s.sendall(request)
    return s


def _answer(s: socket.socket, timeout: float = 15.0) -> bytes:
    """The whole answer the server sends before it closes or goes quiet."""
    s.settimeout(timeout)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
            if b"\r\n\r\n" in out and len(out) > out.index(b"\r\n\r\n") + 4:
                s.settimeout(0.5)  # the body follows the head at once
    except (TimeoutError, ConnectionResetError):
        pass
    return out


def _park(dc, index: str) -> socket.socket:
    return _raw(dc, f"GET /v1/kv/k?index={index}&wait=300s HTTP/1.1\r\nHost: x\r\n\r\n".encode())


TOO_MANY = b"Your IP is issuing too many concurrent connections, please rate limit your calls\n"


def test_the_per_client_cap_counts_open_connections_as_consul_does(tmp_path):
    with DevConsul(data_dir=tmp_path / "dc", max_conns_per_client=3) as dc:
        dc.request("PUT", "/v1/kv/k", "v")
        index = dc.request("GET", "/v1/kv/k").headers["X-Consul-Index"]
        idle = _raw(dc, b"")  # a keep-alive connection that sends nothing still holds a slot
        parked = [_park(dc, index) for _ in range(2)]
        wait_for(lambda: dc.request("GET", "/v1/status/leader").status == 429, message="the cap to bite")
        refused = _answer(_raw(dc, b"GET /v1/status/leader HTTP/1.1\r\nHost: x\r\n\r\n"))
        assert refused.startswith(b"HTTP/1.1 429 Too Many Requests") and refused.endswith(TOO_MANY)
        for s in [idle, *parked]:
            s.close()
        wait_for(lambda: dc.request("GET", "/v1/status/leader").status == 200, message="slots freed on close")


def test_a_controller_keeps_its_session_while_1000_watchers_on_its_host_park(tmp_path):
    """Consul's http_max_conns_per_client (200) caps connections, not requests: a
    controller whose keep-alive connection is open keeps renewing its session while 1,000
    watchers from the same IP try to park; the 801 beyond the cap are refused with 429."""
    raise_file_limit(4096)
    with DevConsul(data_dir=tmp_path / "dc", max_conns_per_client=200) as dc:
        controller = http.client.HTTPConnection(dc.host, dc.port, timeout=10)
        controller.request("PUT", "/v1/session/create", body=json.dumps({"TTL": "10s", "Name": "leader"}))
        sid = json.loads(controller.getresponse().read())["ID"]
        controller.request("PUT", "/v1/kv/k", body=b"v")
        controller.getresponse().read()
        controller.request("GET", "/v1/kv/k")
        response = controller.getresponse()
        index = response.headers["X-Consul-Index"]
        response.read()
        watchers = [_park(dc, index) for _ in range(1000)]
        try:
            def parked() -> int:
                controller.request("GET", "/v1/devconsul/debug")
                return int(json.loads(controller.getresponse().read())["parked_queries"])

            wait_for(lambda: parked() == 199, timeout=60, message="199 watchers parked beside the controller")
            answered = _answered(watchers, want=801)
            assert len(answered) == 801 and all(a.startswith(b"HTTP/1.1 429 ") and a.endswith(TOO_MANY)
                                                for a in answered)
            for _ in range(5):  # the controller's rounds: renew, read the lock, all on its connection
                controller.request("PUT", f"/v1/session/renew/{sid}")
                renewed = controller.getresponse()
                assert renewed.status == 200 and json.loads(renewed.read())[0]["ID"] == sid
            assert parked() == 199
        finally:
            for s in watchers:
                s.close()
            controller.close()


def _answered(sockets: list[socket.socket], want: int) -> list[bytes]:
    """The answers of the sockets the server answers (and closes) at once, waiting until
    `want` have answered or 60 s pass; parked ones stay silent."""
    selector = selectors.DefaultSelector()
    for s in sockets:
        s.setblocking(False)
        selector.register(s, selectors.EVENT_READ)
    answers: dict[socket.socket, bytes] = {}
    closed: set[socket.socket] = set()
    deadline = time.monotonic() + 60
    while len(closed) < want and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=1.0):
            s = key.fileobj
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if chunk:
                answers[s] = answers.get(s, b"") + chunk
            else:
                selector.unregister(s)
                closed.add(s)
    selector.close()
    return [answers.get(s, b"") for s in closed]


def _chunked(path: str, total: int, chunk: int = 64 * 1024) -> bytes:
    """A PUT whose body of `total` bytes comes in chunks, without a Content-Length and
    without the final empty chunk: only a server that counts as it reads answers it."""
    head = f"PUT {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    body = b"".join(b"%x\r\n%s\r\n" % (min(chunk, total - i), b"x" * min(chunk, total - i))
                    for i in range(0, total, chunk))
    return head + body


@pytest.mark.parametrize("path, text", [
    ("/v1/txn", b"Request body too large, max size: 524288 bytes. "
                b"See https://developer.hashicorp.com/docs/agent/config/config-files#txn_max_req_len."),
    ("/v1/kv/big", b"Request body too large, max size: 524288 bytes. "
                   b"See https://developer.hashicorp.com/docs/agent/config/config-files#kv_max_value_size."),
])
def test_a_chunked_body_is_cut_at_consuls_cap(devconsul, path, text):
    s = socket.create_connection((devconsul.host, devconsul.port))
    try:
        s.sendall(_chunked(path, 600 * 1024))  # over 512 KB, and never finished
        answer = _answer(s)
    finally:
        s.close()
    assert answer.startswith(b"HTTP/1.1 413 ") and answer.endswith(text), answer[:300]
    assert devconsul.request("GET", "/v1/kv/big").status == 404


def test_a_complete_chunked_txn_over_the_cap_is_refused(devconsul):
    ops = [{"KV": {"Verb": "set", "Key": f"k{i}", "Value": base64.b64encode(b"v" * 300_000).decode()}}
           for i in range(2)]
    body = json.dumps(ops).encode()  # each value within 512 KB, the request over it
    s = socket.create_connection((devconsul.host, devconsul.port))
    try:
        s.sendall(b"PUT /v1/txn HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                  + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
        answer = _answer(s)
    finally:
        s.close()
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert devconsul.request("GET", "/v1/kv/k0").status == 404


def _txn(dc, ops: list[dict]) -> tuple[int, bytes]:
    r = dc.request("PUT", "/v1/txn", json.dumps(ops))
    return r.status, r.body


def test_a_txn_returns_at_most_512kb_of_values(devconsul):
    big = b"v" * (512 * 1024)
    assert devconsul.request("PUT", "/v1/kv/big", big).status == 200
    assert devconsul.request("PUT", "/v1/kv/mid", b"m" * 300_000).status == 200
    status, body = _txn(devconsul, [{"KV": {"Verb": "get", "Key": "big"}}])  # one maximal value reads
    assert status == 200 and base64.b64decode(json.loads(body)["Results"][0]["KV"]["Value"]) == big
    status, body = _txn(devconsul, [{"KV": {"Verb": "get", "Key": "big"}}] * 128)  # ~90 MB without the cap
    assert status == 409 and len(body) < 4096
    errors = json.loads(body)["Errors"]
    assert errors == [{"OpIndex": 1, "What": "transaction results exceed 524288 bytes of values: "
                                             "read the keys in separate requests"}]
    status, body = _txn(devconsul, [{"KV": {"Verb": "set", "Key": "new", "Value": "MQ=="}},
                                    {"KV": {"Verb": "get", "Key": "mid"}}, {"KV": {"Verb": "get-tree", "Key": "m"}}])
    assert status == 409 and json.loads(body)["Errors"][0]["OpIndex"] == 2
    assert devconsul.request("GET", "/v1/kv/new").status == 404  # rolled back, as any failed txn


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


@pytest.mark.parametrize("path", ["/v1/txn", "/v1/session/create"])
def test_a_deeply_nested_body_is_400_and_the_server_keeps_serving(devconsul, path):
    """200 KB of [[[...]]]: refused like any body that is not the JSON asked for, not a
    500 from a RecursionError."""
    r = devconsul.request("PUT", path, b"[" * 100_000 + b"]" * 100_000)
    assert r.status == 400, r.body
    assert b"nested too deeply" in r.body and b"Traceback" not in r.body and len(r.body) < 300
    assert devconsul.request("PUT", "/v1/kv/after-the-nested-body", "v").status == 200
