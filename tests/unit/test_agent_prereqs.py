"""Which prerequisite the agent names when BPF cannot load (the messages operators see)."""

import pytest

import azprobe.agent.probe as probe
from azprobe.errors import PrerequisiteError


@pytest.fixture
def healthy_host(tmp_path, monkeypatch):
    btf = tmp_path / "vmlinux"
    btf.write_text("")
    tracefs = tmp_path / "tracing"
    for tp in probe.TRACEPOINTS:
        (tracefs / "events" / tp).mkdir(parents=True)
        (tracefs / "events" / tp / "format").write_text("field:int err;\n")
    monkeypatch.setattr(probe, "BTF_VMLINUX", btf)
    monkeypatch.setattr(probe, "TRACEFS", tracefs)
    monkeypatch.setattr(probe.os, "geteuid", lambda: 0)
    return tmp_path


def _message() -> str:
    with pytest.raises(PrerequisiteError) as exc:
        probe.check_prerequisites()
    assert exc.value.exit_code == 1
    assert "\n" not in str(exc.value)
    return str(exc.value)


def test_not_root(healthy_host, monkeypatch):
    monkeypatch.setattr(probe.os, "geteuid", lambda: 1000)
    assert _message().startswith("not root")


def test_no_btf(healthy_host):
    probe.BTF_VMLINUX.unlink()
    assert _message().startswith("no BTF") and "CONFIG_DEBUG_INFO_BTF" in _message()


def test_tracefs_not_mounted(healthy_host, monkeypatch):
    monkeypatch.setattr(probe, "TRACEFS", healthy_host / "unmounted")
    assert f"mount -t tracefs nodev {healthy_host / 'unmounted'}" in _message()


def test_missing_tracepoint(healthy_host):
    (probe.TRACEFS / "events/tcp/tcp_cong_state_set/format").unlink()
    assert _message().startswith("kernel lacks tracepoint tcp:tcp_cong_state_set")


def test_bcc_not_importable(healthy_host, monkeypatch):
    real_import = probe.importlib.import_module

    def no_bcc(name, *a):
        if name == "bcc":
            raise ImportError("no bcc")
        return real_import(name, *a)

    monkeypatch.setattr(probe.importlib, "import_module", no_bcc)
    assert "make setup" in _message() and _message().startswith("bcc not importable")


def test_headers_link_missing(healthy_host, monkeypatch):
    monkeypatch.setattr(probe.os, "uname", lambda: type("U", (), {"release": "0.0.0-none"})())
    assert _message().startswith("kernel headers link missing") and "make setup" in _message()


def test_retransmit_err_field_detection(healthy_host):
    assert probe.tracepoint_has_field("tcp/tcp_retransmit_skb", "err")
    assert not probe.tracepoint_has_field("tcp/tcp_retransmit_skb", "errno")
