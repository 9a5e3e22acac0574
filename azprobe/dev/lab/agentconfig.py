"""The agent configs (docs/contracts.md "Agent config") that match a lab: one for the
whole lab (an agent that sees every namespace, the one-agent lab of old) and one per
client node."""

from __future__ import annotations

from azprobe.config import dump_toml
from azprobe.dev.lab.topology import MAX_AZS, MAX_NODES_PER_AZ, ClientNode, LabPlan

AGENT_BASE_PORT = 9740
# Per-node agents: one port per (slot, AZ, node), above the whole-lab agents' 9740..9771,
# so the node agents of two labs up at once never collide either.
NODE_AGENT_BASE_PORT = 10000
_NODE_PORTS_PER_LAB = (MAX_AZS + 1) * MAX_NODES_PER_AZ


def agent_listen(plan: LabPlan) -> str:
    # One port per address slot, so agents of two labs up at once do not collide.
    return f"127.0.0.1:{AGENT_BASE_PORT + plan.index}"


def node_agent_listen(plan: LabPlan, node: ClientNode) -> str:
    zone = plan.zone(node.az)
    port = NODE_AGENT_BASE_PORT + plan.index * _NODE_PORTS_PER_LAB + zone.number * MAX_NODES_PER_AZ + node.number
    return f"127.0.0.1:{port}"


def render_agent_config(plan: LabPlan, node_az: str | None = None, interval_s: float = 1.0) -> str:
    """TOML for one agent watching the whole lab: node az = the (first) client's AZ, no
    `addresses` (every socket counts), topology = every AZ's CIDRs."""
    az = node_az or plan.azs[0]
    return dump_toml({
        "node": {"name": plan.zone(az).client_ns, "az": az},
        "agent": {"listen": agent_listen(plan), "interval_s": interval_s},
        "topology": plan.topology(),
    }, header=f"Written by `azprobe lab up` for lab {plan.name!r}; `lab down` removes it.")


def render_node_agent_config(plan: LabPlan, node: ClientNode, interval_s: float = 1.0) -> str:
    """TOML for the agent of one client node: counts only the sockets of the node's own
    addresses, as if it ran on that node."""
    return dump_toml({
        "node": {"name": node.name, "az": node.az, "addresses": node.addresses},
        "agent": {"listen": node_agent_listen(plan, node), "interval_s": interval_s},
        "topology": plan.topology(),
    }, header=f"Written by `azprobe lab up` for node {node.name} of lab {plan.name!r}; `lab down` removes it.")
