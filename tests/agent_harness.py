"""Test support: one loaded probe per process, agents on it, and window arithmetic.

Loading BCC costs ~1 s and ~140 MB, so every test module in one pytest process shares
the same Probe; agents take turns on it (each start() takes a fresh baseline).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from azprobe.agent.config import AgentConfig, load_agent_config
from azprobe.agent.main import Agent
from azprobe.agent.probe import Probe
from azprobe.contracts.sketch import Histogram

_probe: Probe | None = None
_probe_lock = threading.Lock()


def shared_probe() -> Probe:
    global _probe
    with _probe_lock:
        if _probe is None:
            _probe = Probe.load()
        return _probe


@contextlib.contextmanager
def running_agent(config: AgentConfig | str | Path, *, config_path: str | Path | None = None,
                  probe: Probe | None = None) -> Iterator[Agent]:
    """An Agent on `probe` (default: the shared one), HTTP on a free 127.0.0.1 port;
    stopped on exit."""
    if not isinstance(config, AgentConfig):
        config_path = config_path or config
        config = load_agent_config(config)
    agent = Agent(config, config_path=config_path, listen=("127.0.0.1", 0), probe=probe or shared_probe())
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()


def latest_seq(agent: Agent) -> int:
    w = agent.ring.latest()
    return w.seq if w else 0


def path_total(agent: Agent, after: int, src: str, dst: str, field: str) -> int:
    """Sum of a counter on one path over the windows with seq > after."""
    return sum(getattr(p, field) for w in agent.ring.after(after) for p in w.paths
               if p.src == src and p.dst == dst)


def path_histogram(agent: Agent, after: int, src: str, dst: str, field: str) -> Histogram:
    out = Histogram()
    for w in agent.ring.after(after):
        for p in w.paths:
            if p.src == src and p.dst == dst:
                out.merge(getattr(p, field))
    return out


def host_total(agent: Agent, after: int, src: str, dst: str, addr: str, field: str) -> int:
    """Sum of one host's counter (or, for "rtt", its RTT samples) over the windows with seq > after."""
    total = 0
    for w in agent.ring.after(after):
        for h in w.hosts:
            if (h.src, h.dst, h.addr) == (src, dst, addr):
                total += sum(h.rtt_buckets) if field == "rtt" else getattr(h, field)
    return total


def hosts_dropped(agent: Agent, after: int) -> int:
    return sum(w.hosts_dropped for w in agent.ring.after(after))
