"""The agent config (CONTRACTS.md format) that matches a lab."""

from __future__ import annotations

import json

from azprobe.lab.topology import LabPlan

AGENT_BASE_PORT = 9740


def agent_listen(plan: LabPlan) -> str:
    # One port per address slot, so agents of two labs up at once do not collide.
    return f"127.0.0.1:{AGENT_BASE_PORT + plan.index}"


def render_agent_config(plan: LabPlan, node_az: str | None = None, interval_s: float = 1.0) -> str:
    """TOML: node az = the (first) client's AZ, topology = every AZ's CIDRs."""
    az = node_az or plan.azs[0]
    zone = plan.zone(az)
    lines = [
        f"# Written by `azprobe lab up` for lab {plan.name!r}; `lab down` removes it.",
        "[node]",
        f"name = {json.dumps(zone.client_ns)}",
        f"az = {json.dumps(az)}",
        "",
        "[agent]",
        f"listen = {json.dumps(agent_listen(plan))}",
        f"interval_s = {interval_s}",
        "",
        "[topology]",
    ]
    for name, cidrs in plan.topology().items():
        lines.append(f"{json.dumps(name)} = [{', '.join(json.dumps(c) for c in cidrs)}]")
    return "\n".join(lines) + "\n"
