"""The agent's tick, on a stand-in for the probe: every window it writes passes the
window contract, also after a long gap since the last one."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

import azprobe.agent.main as agent_main
from azprobe.agent.config import parse_agent_config
from azprobe.agent.main import Agent
from azprobe.agent.windows import Snapshot, path_id
from azprobe.contracts.window import MAX_WINDOW_S, parse_window


class _Counting:
    """What tick() reads of a probe: a snapshot of cumulative counters, 10 more connects each time."""

    source = "bpf"

    def __init__(self) -> None:
        self.connects = 0

    def snapshot(self, rtt_paths=()) -> Snapshot:
        self.connects += 10
        return Snapshot(counters={path_id(1, 2): {"conn_attempts": self.connects, "conn_ok": self.connects}})


@pytest.mark.parametrize("gap_s", [2 * 3600, 30 * 86400])
def test_a_window_after_a_long_gap_spans_at_most_the_limit_and_keeps_its_counts(monkeypatch, gap_s):
    # a clock step forward, a suspend, or an hour of failed reads: a window spanning more
    # than MAX_WINDOW_S is refused by every reader, and all its counts with it
    config = parse_agent_config({"node": {"name": "n1", "az": "az-a"},
                                 "topology": {"az-a": ["198.18.1.0/24"], "az-b": ["198.18.2.0/24"]}})
    agent = Agent(config, probe=_Counting())  # type: ignore[arg-type]
    agent.registry.assign(config.topology)
    agent._prev = agent.probe.snapshot()
    first = agent.tick()
    later = time.time() + gap_s
    monkeypatch.setattr(agent_main, "time", SimpleNamespace(time=lambda: later, monotonic=time.monotonic))
    window = agent.tick()
    assert window.start >= first.end and window.end - window.start == MAX_WINDOW_S
    assert parse_window(window.to_json()).to_json() == window.to_json()  # the readers take it
    assert [(p.src, p.dst, p.conn_attempts) for p in window.paths] == [("az-a", "az-b", 10)]
