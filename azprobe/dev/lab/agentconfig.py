"""The agent config (docs/contracts.md "Agent config") that matches a lab."""

from __future__ import annotations

from azprobe.config import dump_toml
from azprobe.dev.lab.topology import LabPlan

AGENT_BASE_PORT = 9740


def agent_listen(plan: LabPlan) -> str:
    # One port per address slot, so agents of two labs up at once do not collide.
    return f"127.0.0.1:{AGENT_BASE_PORT + plan.index}"


def render_agent_config(plan: LabPlan, node_az: str | None = None, interval_s: float = 1.0) -> str:
    """TOML: node az = the (first) client's AZ, topology = every AZ's CIDRs."""
    az = node_az or plan.azs[0]
    return dump_toml({
        "node": {"name": plan.zone(az).client_ns, "az": az},
        "agent": {"listen": agent_listen(plan), "interval_s": interval_s},
        "topology": plan.topology(),
    }, header=f"Written by `azprobe lab up` for lab {plan.name!r}; `lab down` removes it.")
