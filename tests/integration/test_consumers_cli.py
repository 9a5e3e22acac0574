"""`azprobe weights` and `azprobe envoy-eds` as an operator runs them, against devconsul."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest

from azprobe.clients.consul import ConsulSettings, make_client
from azprobe.dev.devconsul.testing import DevConsul
from tests.helpers import sample_weights_doc, wait_for

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from envoy_data_plane.envoy.config.endpoint.v3 import ClusterLoadAssignment
    from envoy_data_plane.envoy.service.discovery.v3 import DiscoveryResponse

AZPROBE = [sys.executable, "-m", "azprobe.commands.cli"]
KEY = "azprobe/v1/weights"


def azprobe(*args: str, env: dict | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([*AZPROBE, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def azprobe_in_process(capsys, monkeypatch, *args: str) -> tuple[int, str, str]:
    """Run cli.main() in this process (no interpreter start-up): exit code, stdout, stderr."""
    from azprobe.commands import cli

    monkeypatch.setattr(sys, "argv", ["azprobe", *args])
    capsys.readouterr()
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def put(dc, value: str | bytes, key: str = KEY) -> None:
    assert make_client(ConsulSettings(address=dc.url)).kv.put(key, value) is True


class Lines:
    """A subprocess's stdout lines, readable with a deadline (no blocking readline)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, args=(proc.stdout,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in stream:
            self.queue.put(line)

    def next(self, timeout: float = 10) -> str:
        return self.queue.get(timeout=timeout)


@pytest.fixture(scope="module")
def shared_consul(tmp_path_factory):
    """One devconsul for the read-only CLI tests (each test writes its own keys)."""
    with DevConsul(data_dir=tmp_path_factory.mktemp("devconsul")) as dc:
        yield dc


@pytest.fixture
def spawn():
    procs: list[subprocess.Popen] = []

    def start(*args: str) -> subprocess.Popen:
        proc = subprocess.Popen([*AZPROBE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


# --- azprobe weights ---

def test_table_and_json_of_fresh_weights(shared_consul):
    devconsul = shared_consul
    doc = sample_weights_doc(17)
    put(devconsul, doc.dumps())
    table = azprobe("weights", "--consul", devconsul.url)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert "generation 17" in lines[1] and "leader ctl-test" in lines[1] and "state OK" in lines[1]
    assert lines[2].split()[:3] == ["AZ", "SHARE", "WEIGHT"]
    assert lines[3].split()[:3] == ["az-a", "85%", "1.000"]  # highest share first
    assert lines[4].split()[:2] == ["az-b", "15%"] and "degraded" in lines[4]
    as_json = azprobe("weights", "--json", env={"CONSUL_HTTP_ADDR": devconsul.url})
    assert as_json.returncode == 0, as_json.stderr
    printed = json.loads(as_json.stdout)
    assert (printed.pop("sick_hosts"), printed.pop("sick_hosts_status")) == (None, "absent")
    assert "no sick-hosts document" in printed.pop("sick_hosts_note")
    assert printed == doc.to_json()


def test_stale_weights_are_shown_as_stale(shared_consul):
    put(shared_consul, sample_weights_doc(3, ttl_s=5, now=1_000_000_000.0).dumps(), key="stale/weights")
    result = azprobe("weights", "--consul", shared_consul.url, "--prefix", "stale/")
    assert result.returncode == 1
    assert result.stdout.startswith("STALE: weights at stale/weights expired")
    rows = [r for r in result.stdout.splitlines()[3:] if not r.startswith("host list unavailable: ")]
    assert len(rows) == 2 and all(row.split()[7] == "STALE" for row in rows)
    assert " ok " not in result.stdout and "state OK" not in result.stdout
    as_json = azprobe("weights", "--json", "--consul", shared_consul.url, "--prefix", "stale/")
    assert as_json.returncode == 1 and "STALE" in as_json.stderr


def test_from_az_and_missing_key(shared_consul):
    devconsul = shared_consul
    put(devconsul, sample_weights_doc(2, source_az="az-b").dumps(), key=f"{KEY}/from/az-b")
    result = azprobe("weights", "--consul", devconsul.url, "--from", "az-b")
    assert result.returncode == 0 and "view from az-b" in result.stdout
    missing = azprobe("weights", "--consul", devconsul.url, "--from", "az-q")
    assert missing.returncode == 1
    assert missing.stderr.strip() == (f"azprobe: no weights at {KEY}/from/az-q in Consul at {devconsul.url} "
                                      "(is the controller running? check --prefix / --from)")
    assert azprobe("weights", "--consul", devconsul.url, "--prefix", "other/").returncode == 1


INVALID_DOCS = [
    ('{"schema": 1, "generation": 1', "not valid JSON"),
    ('{"schema": 2}', "schema: unsupported version 2"),
    (sample_weights_doc(1).dumps().replace('"share":85', '"share":-85'), "zones.az-a.share"),
    (sample_weights_doc(1).dumps().replace('"health":0.3', '"health":NaN'), "NaN is not allowed"),
    (sample_weights_doc(1).dumps().replace('"generation":1', '"generation":' + "9" * 30), "generation"),
]


def test_invalid_document_is_one_clear_line(shared_consul, capsys, monkeypatch):
    for i, (raw, field) in enumerate(INVALID_DOCS):
        key = f"invalid{i}/weights"
        put(shared_consul, raw, key=key)
        code, out, err = azprobe_in_process(capsys, monkeypatch, "weights", "--consul", shared_consul.url,
                                            "--prefix", f"invalid{i}/")
        assert code == 1 and out == "", field
        assert err.startswith(f"azprobe: weights at {key} are invalid: "), err
        assert field in err and err.count("\n") == 1, err


def _raw_controls(text: str) -> set[str]:
    """Terminal control characters in `text`: C0 but the newline, DEL and C1."""
    return {c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) <= 0x9f}


def test_kv_text_reaches_the_terminal_escaped(shared_consul):
    """Any writer can put a document in KV: its strings reach the terminal without one
    control character (no screen clear, no bell, no title change), as explain shows them."""
    hostile = "\x1b[2J\x07\x9b1m"
    doc = sample_weights_doc(5, {"az-a": 85, "az-b" + hostile: 15})
    raw = json.loads(doc.dumps())
    raw["leader"], raw["model"] = "ctl" + hostile, "model" + hostile
    raw["zones"]["az-a"]["reasons"] = ["p95 over the limit" + hostile]
    put(shared_consul, json.dumps(raw), key="escapes/weights")
    result = azprobe("weights", "--consul", shared_consul.url, "--prefix", "escapes/")
    assert result.returncode == 0, result.stderr
    assert not _raw_controls(result.stdout), repr(result.stdout)
    assert "p95 over the limit\\x1b[2J\\x07" in result.stdout and "leader ctl\\x1b" in result.stdout
    explain = azprobe("explain", "--consul", shared_consul.url, "--prefix", "escapes/")
    assert explain.returncode == 0 and "p95 over the limit\\x1b[2J\\x07" in explain.stdout
    # an invalid document's error quotes KV too (here an unknown field's name)
    raw["zones"]["az-a"]["oops" + hostile] = 1
    put(shared_consul, json.dumps(raw), key="escapes2/weights")
    invalid = azprobe("weights", "--consul", shared_consul.url, "--prefix", "escapes2/")
    assert invalid.returncode == 1 and "unknown field" in invalid.stderr
    assert not _raw_controls(invalid.stderr), repr(invalid.stderr)


def _hosts_doc(reason: str, *, now: float | None = None, ttl_s: float = 60.0) -> str:
    import time

    from azprobe.contracts.weights_hosts import HostsDoc, SickHostEntry

    now = time.time() if now is None else now
    sick = {"az-b": (SickHostEntry("198.18.2.13", (reason, "median node n-az-a-1 (az-a)")),
                     SickHostEntry("198.18.2.10", ("host quorum: 5 of 9 nodes",)))}
    return HostsDoc(generation=5, generated_at=now, expires_at=now + ttl_s, global_view=sick,
                    from_views={"az-a": {"az-b": sick["az-b"][:1]}}).dumps()


def test_weights_show_the_sick_hosts_beside_the_weights(shared_consul):
    hostile = "\x1b[2J\x07\x9b1m"
    doc = sample_weights_doc(5, {"az-a": 50, "az-b": 50})
    put(shared_consul, doc.dumps(), key="hosts1/weights")
    put(shared_consul, _hosts_doc("host quorum: 9 of 9 nodes" + hostile), key="hosts1/hosts")
    table = azprobe("weights", "--consul", shared_consul.url, "--prefix", "hosts1/")
    assert table.returncode == 0, table.stderr
    assert not _raw_controls(table.stdout), repr(table.stdout)
    lines = table.stdout.splitlines()
    at = lines.index("sick hosts (demoted: Envoy DEGRADED) at hosts1/hosts:")
    assert lines[at + 1].split()[:2] == ["az-b", "198.18.2.13"]
    assert "host quorum: 9 of 9 nodes\\x1b[2J\\x07" in lines[at + 1]
    assert lines[at + 2].split()[:2] == ["az-b", "198.18.2.10"]
    as_json = azprobe("weights", "--json", "--consul", shared_consul.url, "--prefix", "hosts1/")
    assert as_json.returncode == 0, as_json.stderr
    printed = json.loads(as_json.stdout)
    assert printed["sick_hosts_status"] == "fresh" and "sick_hosts_note" not in printed
    assert [h["addr"] for h in printed["sick_hosts"]["az-b"]] == ["198.18.2.13", "198.18.2.10"]
    assert printed["sick_hosts"]["az-b"][0]["reasons"][0] == "host quorum: 9 of 9 nodes\\x1b[2J\\x07\\x9b1m"
    assert printed["zones"] == doc.to_json()["zones"]
    # a source view shows that view's hosts
    put(shared_consul, sample_weights_doc(5, source_az="az-a").dumps(), key="hosts1/weights/from/az-a")
    src = azprobe("weights", "--json", "--consul", shared_consul.url, "--prefix", "hosts1/", "--from", "az-a")
    assert [h["addr"] for h in json.loads(src.stdout)["sick_hosts"]["az-b"]] == ["198.18.2.13"]


@pytest.mark.parametrize(("hosts", "status", "line"), [
    (None, "absent", "host list unavailable: no sick-hosts document at {p}hosts"),
    (b'{"schema": 1, "generation"', "invalid", "host list unavailable: the sick-hosts document at {p}hosts is invalid"),
    (b'{"schema": 1}', "invalid", "host list unavailable: the sick-hosts document at {p}hosts is invalid"),
    ("stale", "stale", "sick hosts at {p}hosts: STALE, expired"),
    ("none", "fresh", "sick hosts: none named ({p}hosts)"),
])
def test_weights_without_a_usable_host_list_are_shown_as_today(shared_consul, hosts, status, line):
    prefix = f"nohosts-{status}-{len(str(hosts))}/"
    doc = sample_weights_doc(8)
    put(shared_consul, doc.dumps(), key=prefix + "weights")
    if hosts == "stale":
        hosts = _hosts_doc("old", now=1_000_000_000.0, ttl_s=5)
    elif hosts == "none":
        hosts = _hosts_doc("x").replace('"global":{"az-b"', '"global":{"az-x"')
        hosts = json.dumps({**json.loads(hosts), "global": {}, "from": {}})
    if hosts is not None:
        put(shared_consul, hosts, key=prefix + "hosts")
    table = azprobe("weights", "--consul", shared_consul.url, "--prefix", prefix)
    assert table.returncode == 0, table.stderr
    today = table.stdout.splitlines()
    assert today[2].split()[:3] == ["AZ", "SHARE", "WEIGHT"] and today[3].split()[:2] == ["az-a", "85%"]
    assert today[-1 if status != "stale" else -3].startswith(line.format(p=prefix)), table.stdout
    as_json = azprobe("weights", "--json", "--consul", shared_consul.url, "--prefix", prefix)
    assert as_json.returncode == 0, as_json.stderr
    printed = json.loads(as_json.stdout)
    assert printed["sick_hosts_status"] == status and printed["zones"] == doc.to_json()["zones"]
    assert (printed["sick_hosts"] is None) == (status in ("absent", "invalid"))


def test_unreachable_consul_names_the_address_and_the_fix():
    result = azprobe("weights", env={"CONSUL_HTTP_ADDR": "127.0.0.1:1"})
    assert result.returncode == 1
    assert result.stderr == ("azprobe: cannot reach Consul at http://127.0.0.1:1 while reading "
                             f"'{KEY}' (pass --consul URL or set CONSUL_HTTP_ADDR)\n")
    bad = azprobe("weights", "--consul", "ftp://x")
    assert bad.returncode == 2 and "scheme must be http or https" in bad.stderr


def test_watch_rerenders_on_change_and_ctrl_c_exits_0(devconsul, spawn):
    put(devconsul, sample_weights_doc(1).dumps())
    proc = spawn("weights", "--watch", "--json", "--consul", devconsul.url)
    lines = Lines(proc)
    assert json.loads(lines.next())["generation"] == 1
    put(devconsul, sample_weights_doc(2, {"az-a": 30, "az-b": 70}).dumps())
    second = json.loads(lines.next())
    assert second["generation"] == 2 and second["zones"]["az-b"]["share"] == 70
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 0


# --- azprobe envoy-eds ---

ENDPOINTS = {"az-a": ["198.18.1.10:8080"], "az-b": ["198.18.2.10:8080", "198.18.2.11:8080"], "az-c": ["198.18.3.10:8080"]}


def eds_weights(path: Path) -> tuple[str, dict[str, int]]:
    response = DiscoveryResponse.from_dict(json.loads(path.read_text()))
    cla = ClusterLoadAssignment.parse(response.resources[0].value)
    assert cla.cluster_name == "backend"
    return response.version_info, {e.locality.zone: e.load_balancing_weight for e in cla.endpoints}


def test_envoy_eds_once(shared_consul, tmp_path):
    devconsul = shared_consul
    endpoints = tmp_path / "endpoints.toml"
    endpoints.write_text('az-a = ["198.18.1.10:8080"]\naz-b = ["198.18.2.10:8080"]\naz-c = ["198.18.3.10:8080"]\n')
    put(devconsul, sample_weights_doc(4).dumps(), key="eds-once/weights")
    out = tmp_path / "eds.json"
    result = azprobe("envoy-eds", "--cluster", "backend", "--endpoints", str(endpoints), "--out", str(out),
                     "--consul", devconsul.url, "--prefix", "eds-once/")
    assert result.returncode == 0, result.stderr
    assert eds_weights(out)[1] == {"az-a": 85, "az-b": 15, "az-c": 15}  # az-c: unknown -> smallest


def test_envoy_eds_stale_weights_become_equal(shared_consul, tmp_path):
    devconsul = shared_consul
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps(ENDPOINTS))
    put(devconsul, sample_weights_doc(4, ttl_s=1, now=1_000_000_000.0).dumps(), key="eds-stale/weights")
    out = tmp_path / "eds.json"
    result = azprobe("envoy-eds", "--cluster", "backend", "--endpoints", str(endpoints), "--out", str(out),
                     "--consul", devconsul.url, "--prefix", "eds-stale/")
    assert result.returncode == 0 and "stale" in result.stderr
    version, weights = eds_weights(out)
    assert version.startswith("equal-") and weights == {"az-a": 1, "az-b": 1, "az-c": 1}


@pytest.mark.parametrize("reason", ["invalid", "unreachable"])
def test_envoy_eds_once_without_readable_weights_writes_equal_weights_only_when_there_is_no_file(
        shared_consul, tmp_path, reason):
    # Without a file Envoy has no endpoints for the cluster: equal weights, as --watch
    # writes; a file already there is the last-known-good and stays. Exit 1 either way.
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps(ENDPOINTS))
    prefix = f"eds-{reason}/"
    put(shared_consul, sample_weights_doc(4).dumps(), key=prefix + "weights")
    consul = shared_consul.url if reason == "invalid" else "http://127.0.0.1:1"
    held, fresh = tmp_path / "held.json", tmp_path / "fresh.json"
    first = azprobe("envoy-eds", "--cluster", "backend", "--endpoints", str(endpoints), "--out", str(held),
                    "--consul", shared_consul.url, "--prefix", prefix)
    assert first.returncode == 0, first.stderr
    before = held.read_bytes()
    put(shared_consul, b'{"schema": 1, "zones": {}}', key=prefix + "weights")
    for out in (held, fresh):
        result = azprobe("envoy-eds", "--cluster", "backend", "--endpoints", str(endpoints), "--out", str(out),
                         "--consul", consul, "--prefix", prefix)
        assert result.returncode == 1, result.stderr
        assert ("are invalid" if reason == "invalid" else "cannot reach Consul") in result.stderr.splitlines()[-1]
        assert "Traceback" not in result.stderr
        assert ("wrote equal weights" in result.stderr) == (out is fresh), result.stderr
    assert held.read_bytes() == before  # untouched
    version, weights = eds_weights(fresh)
    assert version.startswith("equal-") and weights == {"az-a": 1, "az-b": 1, "az-c": 1}


BAD_ENDPOINTS = [
    ('{"az-a": ["198.18.1.10"]}', "az-a[0]: '198.18.1.10' is not ip:port"),
    ('{"az-a": ["db.internal:5432"]}', "az-a[0]: 'db.internal:5432': 'db.internal' is not an IP address"),
    ('{"az-a": []}', "az-a: expected a non-empty list"),
    ('{"az-a": ', "endpoints.json: not valid JSON"),
    ("[" * 100_000, "endpoints.json: JSON nested too deeply"),
]


def test_envoy_eds_bad_endpoints_exit_2_naming_the_entry(tmp_path, capsys, monkeypatch):
    for content, message in BAD_ENDPOINTS:
        endpoints = tmp_path / "endpoints.json"
        endpoints.write_text(content)
        code, out, err = azprobe_in_process(capsys, monkeypatch, "envoy-eds", "--cluster", "backend",
                                            "--endpoints", str(endpoints), "--out", str(tmp_path / "eds.json"),
                                            "--consul", "http://127.0.0.1:1")
        assert code == 2, message
        assert message in err and err.count("\n") == 1, err
        assert not (tmp_path / "eds.json").exists()


def test_envoy_eds_watch_rewrites_on_kv_change(devconsul, tmp_path, spawn):
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps(ENDPOINTS))
    out = tmp_path / "eds.json"
    put(devconsul, sample_weights_doc(1, {"az-a": 85, "az-b": 10, "az-c": 5}).dumps())
    proc = spawn("envoy-eds", "--cluster", "backend", "--endpoints", str(endpoints), "--out", str(out),
                 "--watch", "--consul", devconsul.url)
    gen1 = {"az-a": 85, "az-b": 10, "az-c": 5}
    wait_for(lambda: out.exists() and eds_weights(out)[1] == gen1, timeout=10, message="generation 1 rendered")
    put(devconsul, "{ truncated")  # a bad document must not change the file...
    put(devconsul, sample_weights_doc(2, {"az-a": 20, "az-b": 40, "az-c": 40}).dumps())
    wait_for(lambda: eds_weights(out)[1] == {"az-a": 20, "az-b": 40, "az-c": 40}, timeout=10,
             message="generation 2 rendered")
    assert proc.poll() is None  # ...nor stop the watcher
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []


def test_envoy_eds_rewrites_only_when_the_rendering_changes(devconsul, tmp_path, spawn):
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps(ENDPOINTS))
    out = tmp_path / "eds.json"
    same = {"az-a": 85, "az-b": 10, "az-c": 5}
    put(devconsul, sample_weights_doc(1, same).dumps())
    proc = spawn("envoy-eds", "--cluster", "backend", "--endpoints", str(endpoints), "--out", str(out),
                 "--watch", "--consul", devconsul.url)
    wait_for(lambda: out.exists() and eds_weights(out)[1] == same, timeout=10, message="generation 1 rendered")
    first_inode = out.stat().st_ino
    for generation in (2, 3, 4):  # new generations, same weights: nothing to rewrite
        wait_for(lambda: devconsul.parked_queries() > 0, timeout=10, message="the watcher parked")
        put(devconsul, sample_weights_doc(generation, same).dumps())
        # parked again = the watcher got this generation (so none is coalesced away)
        wait_for(lambda: devconsul.parked_queries() > 0, timeout=10, message=f"generation {generation} seen")
    changed = {"az-a": 40, "az-b": 30, "az-c": 30}
    put(devconsul, sample_weights_doc(5, changed).dumps())
    wait_for(lambda: eds_weights(out)[1] == changed, timeout=10, message="generation 5 rendered")
    assert out.stat().st_ino != first_inode
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    writes = [line for line in proc.stderr.read().splitlines() if "wrote" in line]
    assert len(writes) == 2, writes  # generation 1 and generation 5, nothing in between


def test_envoy_eds_once_and_watch_agree_when_the_key_is_absent(devconsul, tmp_path, spawn):
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps(ENDPOINTS))
    once, watched = tmp_path / "once.json", tmp_path / "watched.json"
    result = azprobe("envoy-eds", "--cluster", "backend", "--endpoints", str(endpoints), "--out", str(once),
                     "--consul", devconsul.url, "--prefix", "absent/")
    assert result.returncode == 0 and "no weights at absent/weights" in result.stderr, result.stderr
    proc = spawn("envoy-eds", "--cluster", "backend", "--endpoints", str(endpoints), "--out", str(watched),
                 "--watch", "--consul", devconsul.url, "--prefix", "absent/")
    wait_for(watched.exists, timeout=10, message="the watcher's equal weights")
    assert watched.read_bytes() == once.read_bytes()
    assert eds_weights(once)[1] == {"az-a": 1, "az-b": 1, "az-c": 1}
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


def test_envoy_eds_watch_exits_promptly_on_sigterm_during_a_blocking_query(devconsul, tmp_path, spawn):
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps(ENDPOINTS))
    out = tmp_path / "eds.json"
    put(devconsul, sample_weights_doc(1).dumps())
    proc = spawn("envoy-eds", "--cluster", "backend", "--endpoints", str(endpoints), "--out", str(out),
                 "--watch", "--consul", devconsul.url)
    wait_for(out.exists, timeout=10, message="first rendering")
    wait_for(lambda: devconsul.parked_queries() > 0, timeout=10, message="a parked blocking query")
    proc.send_signal(signal.SIGTERM)
    # The blocking query is parked for 30 s; the exit must not wait for it. The deadline is
    # a third of that, so only a watcher that waits for Consul's answer can miss it.
    assert proc.wait(timeout=10) == 0


def test_envoy_eds_watch_exits_on_sigterm_before_consul_ever_answers(tmp_path, spawn):
    import socket

    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps(ENDPOINTS))
    with socket.socket() as silent:  # accepts the connection, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        silent.settimeout(20)
        proc = spawn("envoy-eds", "--cluster", "backend", "--endpoints", str(endpoints),
                     "--out", str(tmp_path / "eds.json"), "--watch",
                     "--consul", f"http://127.0.0.1:{silent.getsockname()[1]}")
        conn, _ = silent.accept()  # the watcher's first query is in flight
        with conn:
            proc.send_signal(signal.SIGTERM)
            # The watcher would wait 5 s for Consul's first answer; SIGTERM must not.
            assert proc.wait(timeout=4) == 0
