"""controller/topology.py: the controller's AZ set filters every window (pure)."""

from __future__ import annotations

import pytest

from azprobe.config import Section
from azprobe.contracts.window import parse_window
from azprobe.controller.topology import Topology, TopologySettings, parse_topology
from azprobe.errors import ConfigError
from tests.fakeagent import FakeAgent, PathSpec


def _window(az: str, dsts: list[str], src: str | None = None):
    return parse_window(FakeAgent("n1", az, [PathSpec(dst=d, src=src) for d in dsts]).emit(end=10.0))


def test_configured_topology_drops_and_counts():
    topo = Topology(TopologySettings(azs=("az-a", "az-b")))
    kept = topo.admit(_window("az-a", ["az-a", "az-b", "fake-1", "other"]))
    assert [p.dst for p in kept.paths] == ["az-a", "az-b", "other"]
    assert topo.admit(_window("fake-src", ["az-a"])) is None
    foreign = topo.admit(_window("az-a", ["az-b"], src="az-b"))
    assert foreign.paths == []
    c = topo.counters
    assert (c.windows_unknown_az, c.paths_foreign_src, c.paths_unknown_dst) == (1, 1, 1)
    assert topo.azs == ("az-a", "az-b")


def test_one_agent_inventing_azs_adds_none():
    topo = Topology(TopologySettings(azs=("az-a", "az-b", "az-c")))
    kept = topo.admit(_window("az-a", ["az-b", "fake-1", "fake-2", "fake-3", "fake-4", "fake-5"]))
    assert [p.dst for p in kept.paths] == ["az-b"] and topo.counters.paths_unknown_dst == 5
    assert topo.azs == ("az-a", "az-b", "az-c")


def test_azs_is_required():
    for data in ({}, {"azs": []}):
        with pytest.raises(ConfigError) as exc:
            parse_topology(Section(data, "topology"))
        assert exc.value.field == "topology.azs" and 'azs = ["az-a", "az-b", "az-c"]' in str(exc.value)


@pytest.mark.parametrize("azs, problem", [(["az-a", "az-a"], "twice"), (["a b"], "contains"),
                                          (["other"], "reserved"), ([f"az-{i}" for i in range(65)], "exceed")])
def test_bad_topology_config(azs, problem):
    with pytest.raises(ConfigError) as exc:
        parse_topology(Section({"azs": azs}, "topology"))
    assert exc.value.field == "topology.azs" and problem in str(exc.value)
