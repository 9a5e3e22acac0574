"""Names (node, AZ) are bounded and printable, at the agent's config load and in every
window; the window contract's relations and bounds; one window per (node, end)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from azprobe.agent.config import parse_agent_config
from azprobe.contracts.window import MAX_COUNT, WindowError, is_az_name, is_node_name, parse_window, printable
from azprobe.controller.window_store import WindowStore
from azprobe.errors import ConfigError
from tests.fakeagent import FakeAgent, PathSpec

GOOD = {"node": {"name": "n1", "az": "az-a"}, "agent": {"listen": "127.0.0.1:9999"},
        "topology": {"az-a": ["198.18.1.0/24"], "az-b": ["198.18.2.0/24"]}}


@pytest.mark.parametrize("name", ["", "n" * 254, "bad name", "n\x1b[2J"])
def test_agent_config_refuses_a_node_name_the_controller_would_refuse(name):
    with pytest.raises(ConfigError) as exc:
        parse_agent_config({**GOOD, "node": {"name": name, "az": "az-a"}})
    assert exc.value.field == "node.name" and exc.value.exit_code == 2
    assert "\x1b" not in str(exc.value) and "\n" not in str(exc.value)


def test_agent_cli_exits_2_with_one_line_for_an_empty_node_name(tmp_path):
    cfg = tmp_path / "agent.toml"
    cfg.write_text('[node]\nname = ""\naz = "az-a"\n[topology]\naz-a = ["198.18.1.0/24"]\n')
    proc = subprocess.run([sys.executable, "-m", "azprobe.commands.cli", "agent", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "node.name" in lines[0]


def test_name_rules():
    assert is_az_name("az-a") and is_az_name("us-east-1a") and not is_az_name("a" * 64) and not is_az_name("")
    assert is_node_name("ip-10-0-1-5.ec2.internal") and is_node_name("n" * 253) and not is_node_name("n" * 254)
    assert not is_node_name("node\nINFO fake log line")
    assert printable("a\x1b[31mb\nc") == "a\\x1b[31mb\\nc"
    assert printable("x" * 200, 10) == "x" * 10


def _doc(**path) -> dict:
    agent = FakeAgent("n1", "az-a", [PathSpec(dst="az-b")])
    doc = agent.emit(end=100.0)
    doc["paths"][0].update(path)
    return doc


@pytest.mark.parametrize("change, field", [
    ({"conn_attempts": 10, "conn_ok": 10 + 65_537}, "conn_ok"),
    ({"conn_attempts": MAX_COUNT + 1}, "conn_attempts"),
    ({"retrans": 2**50}, "retrans"),
    ({"rtt_us": {"scheme": "hdr", "counts": {"1000": 1}}}, "rtt_us.scheme"),
    ({"rtt_us": {"scheme": "loglin-16", "counts": {str(2**40): 1}}}, "rtt_us.counts"),
    ({"connect_us": {"counts": {"1000": 2**40}}}, "connect_us.counts"),
    ({"dst": "az b"}, "dst"),
])
def test_window_relations_and_bounds(change, field):
    with pytest.raises(WindowError) as exc:
        parse_window(_doc(**change))
    assert field in str(exc.value)


def test_completions_may_carry_over_from_the_last_window():
    w = parse_window(_doc(conn_attempts=0, conn_ok=40, conn_timeout=2))  # connects begun in the window before
    assert w.paths[0].conn_ok == 40


def test_window_level_bounds():
    doc = _doc()
    doc["paths"].append(dict(doc["paths"][0]))
    with pytest.raises(WindowError, match="appears twice"):
        parse_window(doc)
    for key, value in (("node", "x\x00"), ("node", ["x"]), ("az", "a" * 64), ("boot_id", "b" * 129)):
        with pytest.raises(WindowError, match=key):
            parse_window({**_doc(), key: value})
    with pytest.raises(WindowError, match="spans"):
        parse_window({**_doc(), "start": 0.0, "end": 7200.0})


def test_store_keeps_one_window_per_node_and_end():
    agent = FakeAgent("n1", "az-a", [PathSpec(dst="az-b")])
    store = WindowStore(horizon_s=60.0)
    first = parse_window(agent.emit(end=100.0))
    assert store.add("http://a:1", first, 1000.0)
    agent.restart()  # the same window replayed under a new boot_id, and via another URL
    replay = parse_window(agent.emit(end=100.0))
    assert not store.add("http://a:1", replay, 1000.5)
    assert not store.add("http://b:2", replay, 1000.5)
    assert len(store) == 1 and list(store.node_input()) == ["n1"]
    assert store.add("http://a:1", parse_window(agent.emit(end=101.0)), 1001.0)
