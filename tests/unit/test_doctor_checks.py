"""The doctor's pure judgements: clock skew bounds, capability masks, file-based checks
against a made-up tracefs, and the human rendering."""

from __future__ import annotations

import email.utils

import pytest

from azprobe.commands import doctor


def date_header(ts: float) -> str:
    return email.utils.formatdate(ts, usegmt=True)


def test_skew_bounds_account_for_whole_second_dates():
    # Server stamped 1000.7 (Date says 1000); we sent at 1000.6 and got it at 1000.8.
    low, high = doctor.skew_bounds(1000.6, 1000.8, date_header(1000.7))
    assert low == pytest.approx(-0.4) and high == pytest.approx(0.8)
    assert doctor.judge_skew(low, high).status == doctor.OK


@pytest.mark.parametrize(("local_ahead_s", "expected"), [(0.0, "ok"), (0.9, "ok"), (3.0, "warn"), (8.0, "fail"),
                                                          (-3.0, "warn"), (-8.0, "fail")])
def test_judge_skew_thresholds(local_ahead_s, expected):
    server = 5000.3
    sent = server + local_ahead_s - 0.01
    check = doctor.judge_skew(*doctor.skew_bounds(sent, sent + 0.02, date_header(server)))
    assert check.status == expected
    assert (check.fix != "") == (expected != "ok")


STATUS = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t{eff}\nCapBnd:\t000001ffffffffff\n"


@pytest.mark.parametrize(("eff", "expected"), [
    ("000000c000000000", "ok"),   # CAP_BPF + CAP_PERFMON: what the unit grants
    ("0000000000200000", "ok"),   # CAP_SYS_ADMIN alone: kernels before 5.8
    ("0000008000000000", "fail"),  # CAP_BPF alone cannot attach tracepoints
    ("0000000000000000", "fail"),
])
def test_capabilities(eff, expected):
    check = doctor.check_capabilities(doctor.capability_set(STATUS.format(eff=eff)))
    assert check.status == expected


def test_tracepoint_checks_against_a_fake_tracefs(tmp_path):
    assert doctor.check_tracefs(tmp_path).status == "fail"
    (tmp_path / "events" / "tcp" / "tcp_probe").mkdir(parents=True)
    (tmp_path / "events" / "tcp" / "tcp_probe" / "format").write_text("name: tcp_probe\n")
    assert doctor.check_tracefs(tmp_path).status == "ok"
    assert doctor.check_tracepoint(tmp_path, "tcp/tcp_probe").status == "ok"
    missing = doctor.check_tracepoint(tmp_path, "tcp/tcp_cong_state_set")
    assert missing.status == "fail" and missing.name == "tracepoint tcp:tcp_cong_state_set"
    assert "kernel" in missing.fix


def test_btf_check(tmp_path):
    from tests.btf_blobs import kernel_like_sock

    assert doctor.check_btf(tmp_path / "vmlinux").status == "fail"
    (tmp_path / "vmlinux").write_bytes(b"")
    unreadable = doctor.check_btf(tmp_path / "vmlinux")
    assert unreadable.status == "warn" and "classic tracepoint" in unreadable.detail
    (tmp_path / "vmlinux").write_bytes(kernel_like_sock())
    readable = doctor.check_btf(tmp_path / "vmlinux")
    assert readable.status == "ok" and "BTF-typed tracepoints" in readable.detail
    (tmp_path / "vmlinux").write_bytes(kernel_like_sock(tracepoints={}))
    no_tracepoints = doctor.check_btf(tmp_path / "vmlinux")
    assert no_tracepoints.status == "warn" and "no tracepoint tcp_probe" in no_tracepoints.detail


def test_render_shows_fix_only_for_problems():
    lines: list[str] = []
    doctor.render_human([doctor.ok("a", "fine"), doctor.warn("b", "meh", "do b"), doctor.fail("c", "bad", "do c")],
                        lines.append)
    assert lines == ["✓ a: fine", "! b: meh", "    fix: do b", "✗ c: bad", "    fix: do c",
                     "NOT ready: 3 checks, 1 failed, 1 warnings"]


def test_json_report_overall():
    report = doctor.report_json(doctor.Role.AGENT, [doctor.ok("a", "x"), doctor.warn("b", "y", "z")])
    assert report["ok"] is True
    assert report["checks"][1] == {"name": "b", "status": "warn", "detail": "y", "fix": "z"}


# --- the controller's pulls: plain HTTP off this host is a warning ---------------------------

def _agents(agents: dict) -> object:
    from azprobe.controller.config import parse_config

    return parse_config({"agents": agents, "topology": {"azs": ["az-a"]}}).agents


@pytest.mark.parametrize("agents, status", [
    ({"static": ["http://127.0.0.1:9740", "http://[::1]:9740", "http://localhost:9740"]}, "ok"),
    ({"static": ["http://127.0.0.1:9740", "http://198.18.1.2:9740"]}, "warn"),
    ({"discover": "consul"}, "warn"),
    ({"static": ["https://198.18.1.2:9740"], "identity": "spiffe://lab/node/{node}",
      "tls": {"cert_file": "/c", "key_file": "/k", "ca_file": "/ca"}}, "ok"),
])
def test_plain_http_from_a_non_loopback_agent_is_a_warning(agents, status):
    from azprobe.commands.doctor import agents_transport_check

    check = agents_transport_check(_agents(agents))
    assert check.status == status, check
    if status == "warn":
        assert "plain HTTP" in check.detail and "[agents.tls]" in check.fix


def test_a_controller_running_its_cycle_as_plain_python_is_a_warning_naming_the_fix():
    import types

    from azprobe.commands.doctor import compiled_check

    compiled = compiled_check(types.SimpleNamespace(__file__="/x/window_store.cpython-311-x86_64-linux-gnu.so"))
    plain = compiled_check(types.SimpleNamespace(__file__="/x/window_store.py"))
    assert (compiled.name, compiled.status, plain.name, plain.status) == ("compiled", "ok", "compiled", "warn")
    assert "AZPROBE_COMPILE=0" in plain.detail and "gcc and python3-dev" in (plain.fix or "")
