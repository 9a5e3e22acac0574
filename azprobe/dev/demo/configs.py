"""Config files the demo generates for its own agent and controllers. Pure text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from azprobe.config import dump_toml
from azprobe.controller.config import DEFAULT_EVALUATION_WINDOW_S


def agent_config_for_demo(doc: Mapping[str, Any], listen: str, interval_s: float | None = None) -> str:
    """The lab's agent config with our own listen address (loopback port 0, reported with
    --address-file, so the demo never collides with an agent already running on the
    default port) and, optionally, a shorter window interval."""
    tables = {name: dict(table) for name, table in doc.items()}
    tables.setdefault("agent", {})["listen"] = listen
    if interval_s is not None:
        tables["agent"]["interval_s"] = interval_s
    return dump_toml(tables)


LEADER_PROBE_FAILURES = 1  # a silent leader probe (one per cycle) before a standby takes over


@dataclass(frozen=True)
class ControllerPlan:
    """What differs between the demo's controllers: everything else is the scenario's."""

    name: str
    listen: str = "127.0.0.1:0"  # /metrics and /healthz; port 0 is advertised as the port bound


def controller_config(plan: ControllerPlan, *, consul_url: str, prefix: str, agent_urls: Sequence[str],
                      azs: Sequence[str], interval_s: float = 1.0, evaluation_window_s: float = DEFAULT_EVALUATION_WINDOW_S,
                      lock_delay_s: float = 2.0, session_ttl_s: float = 10.0, heartbeat_s: float = 30.0,
                      model: str = "default",
                      min_samples: int = 20, safety: Mapping[str, float] | None = None,
                      prometheus_url: str | None = None) -> str:
    """A controller config (docs/contracts.md "Controller config") with short intervals, so a scenario runs in seconds.
    `azs`: the lab's AZs, the controller's [topology]. safety: [safety] keys to set (e.g.
    drain_dwell_s, recover_dwell_s); every other key keeps the controller's default.
    prometheus_url: read the agents through that Prometheus (agents.source = "prometheus")
    instead of pulling them."""
    safety_table: dict[str, Any] = {"min_samples": min_samples, "heartbeat_s": heartbeat_s, **(safety or {})}
    agents: dict[str, Any] = {"static": list(agent_urls), "pull_timeout_s": 0.5}
    extra: dict[str, Any] = {}
    if prometheus_url:
        agents = {"source": "prometheus"}
        extra["prometheus"] = {"url": prometheus_url, "lookback_s": 5.0, "query_timeout_s": 1.0}
    return dump_toml({
        "controller": {"name": plan.name, "interval_s": interval_s, "evaluation_window_s": evaluation_window_s,
                       "listen": plan.listen, "session_ttl_s": session_ttl_s, "lock_delay_s": lock_delay_s,
                       # both controllers share this host: a standby probes the leader's
                       # /healthz and invalidates a dead leader's session without waiting
                       # for Consul's 2 x TTL
                       "advertise": plan.listen, "leader_probe_failures": LEADER_PROBE_FAILURES},
        "consul": {"address": consul_url, "prefix": prefix},
        "agents": agents,
        "model": {"name": model},
        "safety": safety_table,
        "topology": {"azs": list(azs)},
        **extra,
    })
