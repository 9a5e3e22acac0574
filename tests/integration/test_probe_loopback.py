"""The real probe on the real kernel, driven by loopback TCP in the root namespace.

Topology az-a = 127.0.0.2, az-b = 127.0.0.3, az-c = 127.0.0.4 (the agent is in az-a): no
other test on this box uses those addresses, so exact counts on these paths are ours.
Tracepoints are global, so other traffic shows up too, but only on other paths.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
import urllib.request
from pathlib import Path

import pytest

from azprobe import bpf as bpf_consts
from azprobe.agent import btf
from azprobe.agent.probe import Probe
from tests.agent_harness import latest_seq, path_histogram, path_total, running_agent
from tests.helpers import EchoServer, wait_for

pytestmark = pytest.mark.kernel

A, B, C, D = "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"
CONFIG = f"""
[node]
name = "loopback"
az = "az-a"
[agent]
interval_s = 0.2
[topology]
az-a = ["{A}/32"]
az-b = ["{B}/32"]
az-c = ["{C}/32"]
"""


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("agent") / "agent.toml"
    path.write_text(CONFIG)
    return path


@pytest.fixture(scope="module")
def agent(config_file):
    with running_agent(config_file) as a:
        wait_for(lambda: latest_seq(a) >= 1, timeout=5, message="first window")
        yield a


TCPI_TOTAL_RETRANS = slice(100, 104)  # struct tcp_info.tcpi_total_retrans


def _connect(dst: str, port: int, *, family: int = socket.AF_INET, syncnt: int | None = None,
             timeout: float = 5.0, payload: bytes = b"", info: dict | None = None) -> str:
    """One connect from az-a's address; returns "ok", "refused" or "timeout". `info` gets
    the kernel's own retransmit count for the socket (TCP_INFO) and how long connect()
    took as seen from user space (`connect_us`)."""
    if family == socket.AF_INET6:  # an IPv6 socket talking to v4-mapped addresses
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.bind(("::ffff:" + A, 0))
        target = ("::ffff:" + dst, port)
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((A, 0))
        target = (dst, port)
    with s:
        if syncnt is not None:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_SYNCNT, syncnt)
        s.settimeout(timeout)
        started_ns = time.perf_counter_ns()
        try:
            s.connect(target)
            if info is not None:
                info["connect_us"] = (time.perf_counter_ns() - started_ns) / 1000
        except ConnectionRefusedError:
            return "refused"
        except (TimeoutError, socket.timeout):
            if info is not None:
                raw = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
                info["total_retrans"] = int.from_bytes(raw[TCPI_TOTAL_RETRANS], "little")
            return "timeout"
        if payload:
            s.sendall(payload)
            assert s.recv(len(payload)) == payload
        return "ok"


_reserved_ports: list[socket.socket] = []


@pytest.fixture(scope="module", autouse=True)
def _release_reserved_ports():
    yield
    while _reserved_ports:
        _reserved_ports.pop().close()


def _closed_port(host: str) -> int:
    """Bound but never listening, so the kernel answers SYNs with RST; kept bound until
    the module ends, so no other process can start listening there meanwhile."""
    s = socket.socket()
    s.bind((host, 0))
    _reserved_ports.append(s)
    return s.getsockname()[1]


def _settle(agent, after: int, src: str, dst: str, field: str, want: int) -> int:
    """Wait for the count to reach `want`, then one more window so late extras show."""
    # A deadline for a condition, generous for a loaded CI box; the message carries what the
    # agent did count on the path, so a lost count is told apart from a late one.
    try:
        wait_for(lambda: path_total(agent, after, src, dst, field) >= want, timeout=30,
                 message=f"{field} on {src}->{dst} >= {want}")
    except AssertionError as exc:
        gauges = agent.gauges()
        raise AssertionError(f"{exc}; the agent's totals on {src}->{dst} since it loaded: "
                             f"{agent.path_totals().get((src, dst))}; handler runs the kernel skipped: "
                             f"{gauges['handler_misses_total']:.0f}, untracked connects: "
                             f"{gauges['untracked_connects_total']:.0f}") from None
    seq = latest_seq(agent)
    wait_for(lambda: latest_seq(agent) > seq, timeout=5, message="one more window")
    return path_total(agent, after, src, dst, field)


def _echo_rtt_samples(agent, after: int, server: "EchoServer", src: str, dst: str, **connect) -> int:
    """One more echo exchange with `server`; then the srtt samples counted on src->dst."""
    assert _connect(server.host, server.port, payload=b"x" * 2000, **connect) == "ok"
    return path_histogram(agent, after, src, dst, "rtt_us").total


def test_every_segment_counts_when_rtt_is_not_sampled(config_file):
    # rtt_sample_ticks = 1: a probe of its own (the module's shares the default, 4).
    probe = Probe.load(rtt_sample_ticks=1)
    server = EchoServer(B)
    try:
        with running_agent(config_file, probe=probe) as agent:
            assert agent.gauges()["rtt_sample_ticks"] == 1  # /metrics: azprobe_rtt_sample_ticks
            start = latest_seq(agent)
            assert [_connect(B, server.port, payload=b"x" * 2000) for _ in range(20)] == ["ok"] * 20
            assert _settle(agent, start, "az-a", "az-b", "conn_ok", 20) == 20
            assert path_histogram(agent, start, "az-a", "az-b", "rtt_us").total >= 20  # each received its echo
    finally:
        server.close()
        probe.close()


def test_connects_and_rtt_on_the_right_path(agent):
    server = EchoServer(B)
    try:
        start = latest_seq(agent)
        sockets_from_ns = time.perf_counter_ns()
        seen = [{} for _ in range(20)]
        outcomes = [_connect(B, server.port, payload=b"x" * 2000, info=info) for info in seen]
        assert outcomes == ["ok"] * 20
        assert _settle(agent, start, "az-a", "az-b", "conn_ok", 20) == 20
        assert path_total(agent, start, "az-a", "az-b", "conn_attempts") == 20
        assert path_total(agent, start, "az-a", "az-b", "conn_refused") == 0
        assert path_total(agent, start, "az-a", "az-b", "conn_timeout") == 0
        connect = path_histogram(agent, start, "az-a", "az-b", "connect_us")
        assert connect.total == 20
        # Orderings, not stopwatches: the kernel's SYN -> established time fits inside the
        # connect() call around it (+1/16: the sketch's bucket width), and no RTT sample of
        # these sockets is longer than the time they existed.
        slowest_connect_us = max(info["connect_us"] for info in seen)
        assert 0 < connect.quantile(0.5) <= slowest_connect_us * (1 + 1 / 16) + 1, (connect, seen)
        assert agent.gauges()["rtt_sample_ticks"] == 4  # the default
        # RTT is sampled during one kernel tick in rtt_sample_ticks (4): exchange until
        # samples are in (test_every_segment_counts_when_rtt_is_not_sampled: all of them).
        wait_for(lambda: _echo_rtt_samples(agent, start, server, "az-a", "az-b") >= 3, timeout=30,
                 interval=0.05, message="3 srtt samples on az-a->az-b")
        rtt = path_histogram(agent, start, "az-a", "az-b", "rtt_us")
        assert rtt.quantile(0.95) <= (time.perf_counter_ns() - sockets_from_ns) / 1000
        # nothing of this landed on az-c
        assert path_total(agent, start, "az-a", "az-c", "conn_attempts") == 0
        assert path_histogram(agent, start, "az-a", "az-c", "rtt_us").total == 0
    finally:
        server.close()


# bpf_probe_read (4), bpf_probe_read_str (45), bpf_probe_read_{user,kernel}{,_str} (112-115)
PROBE_READ_HELPERS = {4, 45, 112, 113, 114, 115}
# tcp_probe's other calls: bpf_map_lookup_elem (1), bpf_jiffies64 (118).
BPF_CALLS_OF_TCP_PROBE = {1, 118}


def _helper_calls(bytecode: bytes) -> set[int]:
    """The helper ids the program calls (BPF_JMP|BPF_CALL with src_reg 0)."""
    calls = set()
    for at in range(0, len(bytecode), 8):
        code, regs, _off, imm = struct.unpack_from("<BBhi", bytecode, at)
        if code == 0x85 and regs >> 4 == 0:
            calls.add(imm)
    return calls


def _bpf_prog_fds() -> int:
    """BPF programs this process holds open."""
    fds = Path("/proc/self/fd")
    count = 0
    for fd in fds.iterdir():
        try:
            count += os.readlink(fd) == "anon_inode:bpf-prog"
        except OSError:
            pass
    return count


def test_hooks_are_btf_typed_where_the_kernel_has_btf(agent):
    # This kernel has BTF: the handlers hook tp_btf tracepoints and read the socket with
    # plain loads at BTF offsets. The other tests of this module count and attribute
    # through them (IPv4 and IPv6 addresses, ports in the refusal events, srtt).
    probe = agent.probe
    assert probe.hooks == "btf"
    assert agent.gauges()["btf_hooks"] == 1  # azprobe_btf_hooks on /metrics
    assert sorted(h.name for h in probe.btf_handlers) == sorted(btf.BTF_TRACEPOINTS)
    for handler in probe.btf_handlers:
        assert handler.link_fd is not None, handler.name
        calls = _helper_calls(probe.bpf.dump_func(f"tp_btf__{handler.name}".encode()))
        assert not calls & PROBE_READ_HELPERS, (handler.name, calls)
        if handler.name == "tcp_probe":  # this kernel has bpf_rdonly_cast: the srtt read needs no helper
            assert calls == {bpf_consts.constant("KFUNC_RDONLY_CAST"), *BPF_CALLS_OF_TCP_PROBE}, calls
    assert set(probe.program_stats()) == set(btf.BTF_TRACEPOINTS) | {"tcp_retransmit_skb"}


def test_without_the_rdonly_cast_kfunc_tcp_probe_types_the_socket_with_a_helper(monkeypatch):
    # Kernels before 6.2 have no bpf_rdonly_cast: tcp_probe then calls bpf_skc_to_tcp_sock
    # (helper 137), and the verifier on this kernel takes that variant too.
    def no_function(self, name):
        raise btf.BTFError(f"the kernel's BTF has no function {name}")

    monkeypatch.setattr(btf.BTF, "function_id", no_function)
    probe = Probe.load()
    try:
        assert probe.hooks == "btf"
        calls = _helper_calls(probe.bpf.dump_func(b"tp_btf__tcp_probe"))
        assert 137 in calls and bpf_consts.constant("KFUNC_RDONLY_CAST") not in calls, calls
    finally:
        probe.close()


def test_a_kernel_that_refuses_a_btf_handler_gets_classic_hooks(monkeypatch, caplog):
    # Point inet_sock_set_state's handler at tcp_probe, which has no third argument: the
    # verifier refuses it, and the probe loads on classic tracepoints with one line.
    real = btf.tracepoint_ids
    monkeypatch.setattr(btf, "tracepoint_ids", lambda kernel: {
        **real(kernel), "inet_sock_set_state": real(kernel)["tcp_probe"]})
    before = _bpf_prog_fds()
    with caplog.at_level("WARNING", logger="azprobe.agent.probe"):
        probe = Probe.load()
    try:
        assert probe.hooks == "classic" and not probe.btf_handlers
        assert b"tracepoint__sock__inet_sock_set_state" in probe.bpf.funcs
        [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("hooks:")]
        assert line.startswith("hooks: classic tracepoints, not BTF-typed ones (tp_btf inet_sock_set_state "
                               "refused ("), line
        reason = line.split("): ", 1)[1]  # the verifier's, e.g. "invalid bpf_context access off=16 size=8"
        assert reason.endswith(")") and reason != "no verifier log)" and not reason.startswith("processed"), line
        assert _bpf_prog_fds() == before + len(probe.bpf.funcs)  # the refused load left nothing open
    finally:
        probe.close()
    assert _bpf_prog_fds() == before


def _syn_timeout_counted(agent, probe: Probe, start: int, port: int) -> None:
    """One unanswered connect to az-c's full listener, counted as one SYN timeout. The
    one loss the probe cannot help: the kernel skips a classic handler's run when a BPF
    program or a map read is under way on that CPU (a timer closing the socket
    interrupted one), and says so in the handlers' recursion_misses. Only then is the
    connect made once more."""
    for attempt in (1, 2):
        misses = probe.handler_misses
        assert _connect(C, port, syncnt=1, timeout=10) == "timeout"
        try:
            assert _settle(agent, start, "az-a", "az-c", "conn_timeout", 1) == 1
            return
        except AssertionError:
            if attempt == 2 or probe.handler_misses == misses:
                raise


def test_without_btf_the_classic_tracepoints_count_alike(config_file, tmp_path, caplog):
    with caplog.at_level("WARNING", logger="azprobe.agent.probe"):
        probe = Probe.load(btf_path=tmp_path / "no-vmlinux")
    assert probe.hooks == "classic"
    assert b"tracepoint__sock__inet_sock_set_state" in probe.bpf.funcs
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("hooks:")] == [
        f"hooks: classic tracepoints, not BTF-typed ones (cannot read {tmp_path / 'no-vmlinux'}: No such file or directory)"]
    server = EchoServer(B)
    port = _closed_port(C)
    # A listener whose accept queue is full drops SYNs: a SYN timeout.
    listener = socket.socket()
    listener.bind((C, 0))
    listener.listen(0)
    filler = socket.create_connection((C, listener.getsockname()[1]), timeout=5, source_address=(A, 0))
    try:
        with running_agent(config_file, probe=probe) as agent:
            assert agent.gauges()["btf_hooks"] == 0
            start = latest_seq(agent)
            events_before = max((e["id"] for e in agent.events_doc(0)["events"]), default=0)
            assert [_connect(B, server.port, payload=b"z") for _ in range(3)] == ["ok"] * 3
            assert [_connect(C, port, family=socket.AF_INET6) for _ in range(2)] == ["refused"] * 2
            assert _settle(agent, start, "az-a", "az-b", "conn_ok", 3) == 3
            assert _settle(agent, start, "az-a", "az-c", "conn_refused", 2) == 2
            events = [e for e in agent.events_doc(events_before)["events"] if e["daddr"] == C and e["dport"] == port]
            assert [e["kind"] for e in events] == ["conn_refused"] * 2
            _syn_timeout_counted(agent, probe, start, listener.getsockname()[1])
            assert agent.gauges()["handler_misses_total"] == probe.handler_misses
            assert agent.path_totals()[("az-a", "az-c")]["syn_rto"] >= 1  # tcp_cong_state_set
            assert path_total(agent, start, "az-a", "az-c", "rto") == 0
            wait_for(lambda: _echo_rtt_samples(agent, start, server, "az-a", "az-b") >= 3, timeout=30,
                     interval=0.05, message="3 srtt samples on az-a->az-b")  # tcp_probe
    finally:
        filler.close()
        listener.close()
        server.close()
        probe.close()


def test_refusals_counted_on_their_path_with_events(agent):
    port = _closed_port(C)
    start = latest_seq(agent)
    events_before = max((e["id"] for e in agent.events_doc(0)["events"]), default=0)
    assert [_connect(C, port) for _ in range(5)] == ["refused"] * 5
    assert _settle(agent, start, "az-a", "az-c", "conn_refused", 5) == 5
    assert path_total(agent, start, "az-a", "az-c", "conn_attempts") == 5
    assert path_total(agent, start, "az-a", "az-c", "conn_timeout") == 0
    assert path_total(agent, start, "az-a", "az-c", "conn_ok") == 0
    assert path_total(agent, start, "az-a", "az-b", "conn_refused") == 0
    events = [e for e in agent.events_doc(events_before)["events"] if e["daddr"] == C]
    assert [(e["kind"], e["src"], e["dst"], e["dport"]) for e in events] == [("conn_refused", "az-a", "az-c", port)] * 5


def test_ipv6_sockets_attribute_like_ipv4(agent):
    # AF_INET6 sockets on v4-mapped addresses take the tracepoints' IPv6 field layout.
    server = EchoServer(B)
    port = _closed_port(C)
    try:
        start = latest_seq(agent)
        assert [_connect(B, server.port, family=socket.AF_INET6, payload=b"y" * 100) for _ in range(3)] == ["ok"] * 3
        assert [_connect(C, port, family=socket.AF_INET6) for _ in range(2)] == ["refused"] * 2
        assert _settle(agent, start, "az-a", "az-b", "conn_ok", 3) == 3
        assert path_total(agent, start, "az-a", "az-c", "conn_refused") == 2

        # srtt of IPv6 sockets (tcp_probe's IPv6 layout); RTT is sampled, so exchange until in.
        wait_for(lambda: _echo_rtt_samples(agent, start, server, "az-a", "az-b", family=socket.AF_INET6) >= 3,
                 timeout=30, interval=0.05, message="3 srtt samples from IPv6 sockets on az-a->az-b")
        assert path_histogram(agent, start, "az-a", "az-c", "rtt_us").total == 0
    finally:
        server.close()


def test_syn_timeout_counts_retransmit_and_timeout_not_rto(agent):
    # A listener whose accept queue is full drops SYNs: a real unanswered connect.
    listener = socket.socket()
    listener.bind((C, 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.create_connection((C, port), timeout=5, source_address=(A, 0))
    try:
        start = latest_seq(agent)
        # TCP_SYNCNT=1 bounds the connect at ~3 s; with 6.18's linear 1 s SYN timeouts
        # that is 2 retransmits, which the kernel reports per socket in TCP_INFO.
        info: dict = {}
        assert _connect(C, port, syncnt=1, timeout=10, info=info) == "timeout"
        assert info["total_retrans"] >= 1
        assert _settle(agent, start, "az-a", "az-c", "conn_timeout", 1) == 1
        assert path_total(agent, start, "az-a", "az-c", "syn_retrans") == info["total_retrans"]
        assert path_total(agent, start, "az-a", "az-c", "retrans") == info["total_retrans"]
        assert path_total(agent, start, "az-a", "az-c", "rto") == 0  # SYN timeouts are not data RTOs
        assert path_total(agent, start, "az-a", "az-c", "conn_refused") == 0
        totals = agent.path_totals()[("az-a", "az-c")]
        assert totals["syn_rto"] >= 1
    finally:
        filler.close()
        listener.close()


def test_a_full_connect_set_leaves_new_connects_untracked_and_frees_its_slots(config_file):
    # One set of two slots (connect_set_bits 0): three unanswered connects at once. The
    # two that hold the slots keep them (a held slot is never taken over: docs/probe.md
    # "What a connection costs"), the third is counted untracked, not as an outcome; once
    # the two time out, their slots are free again for the next connect.
    import threading

    probe = Probe.load(connect_set_bits=0)
    listener = socket.socket()
    listener.bind((C, 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.create_connection((C, port), timeout=5, source_address=(A, 0))
    server = EchoServer(B)
    try:
        with running_agent(config_file, probe=probe) as agent:
            start = latest_seq(agent)
            untracked_before = probe.untracked_connects
            results: list[str] = []
            threads = [threading.Thread(target=lambda: results.append(_connect(C, port, syncnt=1, timeout=10)))
                       for _ in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=20)
            assert results == ["timeout"] * 3
            assert _settle(agent, start, "az-a", "az-c", "conn_attempts", 3) == 3
            timeouts = path_total(agent, start, "az-a", "az-c", "conn_timeout")
            # Other sockets of this box share the one set, so at least one of ours was
            # left out, and never more outcomes than slots.
            assert 1 <= timeouts <= 2
            assert probe.untracked_connects - untracked_before >= 1
            assert agent.gauges()["untracked_connects_total"] == probe.untracked_connects
            assert _connect(B, server.port, payload=b"x") == "ok"
            assert _settle(agent, start, "az-a", "az-b", "conn_ok", 1) == 1
    finally:
        server.close()
        filler.close()
        listener.close()
        probe.close()


def test_http_windows_metrics_healthz(agent):
    url = agent.url
    doc = json.load(urllib.request.urlopen(f"{url}/v1/windows?after=0", timeout=5))
    assert (doc["node"], doc["az"], doc["boot_id"]) == ("loopback", "az-a", agent.boot_id)
    seqs = [w["seq"] for w in doc["windows"]]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) and seqs[0] >= 1
    middle = seqs[len(seqs) // 2]
    later = json.load(urllib.request.urlopen(f"{url}/v1/windows?after={middle}", timeout=5))["windows"]
    assert [w["seq"] for w in later][: len(seqs) - seqs.index(middle) - 1] == seqs[seqs.index(middle) + 1:]
    assert all(w["seq"] > middle for w in later)
    with urllib.request.urlopen(f"{url}/healthz", timeout=5) as resp:
        assert resp.status == 200
    metrics = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    assert 'azprobe_path_conn_refused_total{dst_az="az-c",node="loopback",src_az="az-a"}' in metrics
    assert 'azprobe_agent_info{az="az-a",boot_id="' in metrics and "# TYPE azprobe_path_rtt_seconds histogram" in metrics
    assert 'azprobe_events_total{kind="conn_refused"}' in metrics
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(f"{url}/v1/windows?after=x", timeout=5)
    assert exc.value.code == 400


def test_reload_refills_topology_and_keeps_ids(agent, config_file):
    port = _closed_port(D)
    ids_before = agent.registry.names
    try:
        config_file.write_text(CONFIG + f'az-d = ["{D}/32"]\n')
        assert agent.reload()
        assert {k: v for k, v in agent.registry.names.items() if k in ids_before} == ids_before
        start = latest_seq(agent)
        assert _connect(D, port) == "refused"
        assert _settle(agent, start, "az-a", "az-d", "conn_refused", 1) == 1
        # A broken file keeps the old topology.
        config_file.write_text(CONFIG + 'az-d = ["127.0.0.5/33"]\n')
        assert not agent.reload()
        start = latest_seq(agent)
        assert _connect(D, port) == "refused"
        assert _settle(agent, start, "az-a", "az-d", "conn_refused", 1) == 1
    finally:
        config_file.write_text(CONFIG)
        assert agent.reload()
    start = latest_seq(agent)
    assert _connect(D, port) == "refused"
    assert _settle(agent, start, "az-a", "other", "conn_refused", 1) >= 1
    assert path_total(agent, start, "az-a", "az-d", "conn_refused") == 0


def test_top_and_trace_read_the_agent(agent):
    import subprocess
    import sys

    port = _closed_port(C)
    latest_seq(agent)  # the agent is up and serving before the trace starts
    trace = subprocess.Popen([sys.executable, "-m", "azprobe.commands.cli", "trace", "--agent", agent.url, "--json",
                              "--duration", "30", "--poll", "0.1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        # trace starts from "now": keep making refusals until it prints one
        lines: list[str] = []

        def traced() -> bool:
            assert _connect(C, port) == "refused"
            return trace.poll() is None and _read_line_with(trace, lines, C)
        wait_for(traced, timeout=15, interval=0.2, message="trace printing a refusal")
    finally:
        trace.terminate()
        trace.wait(timeout=5)
    event = json.loads(next(line for line in lines if C in line))
    assert (event["kind"], event["src"], event["dst"], event["dport"]) == ("conn_refused", "az-a", "az-c", port)

    top = subprocess.run([sys.executable, "-m", "azprobe.commands.cli", "top", "--agent", agent.url, "--once", "--json",
                          "--windows", "300"], capture_output=True, text=True, timeout=30)
    assert top.returncode == 0, top.stderr
    doc = json.loads(top.stdout)
    assert doc["boot_id"] == agent.boot_id
    row = next(p for p in doc["paths"] if (p["src"], p["dst"]) == ("az-a", "az-c"))
    assert row["failure_pct"] > 0 and row["conn_attempts"] >= 1
    table = subprocess.run([sys.executable, "-m", "azprobe.commands.cli", "top", "--agent", agent.url, "--once"],
                           capture_output=True, text=True, timeout=30)
    assert table.returncode == 0 and "P95 RTT ms" in table.stdout
    down = subprocess.run([sys.executable, "-m", "azprobe.commands.cli", "top", "--agent", "http://127.0.0.1:1", "--once"],
                          capture_output=True, text=True, timeout=30)
    assert down.returncode == 1 and "is `azprobe agent` running there?" in down.stderr


def _read_line_with(proc, lines: list[str], needle: str) -> bool:
    import select

    while select.select([proc.stdout], [], [], 0.05)[0]:
        line = proc.stdout.readline()
        if not line:
            return False
        lines.append(line)
        if needle in line:
            return True
    return False
