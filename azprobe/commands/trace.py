"""`azprobe trace`: a live view of SYN retransmits, RTOs and failed connects, read from the
agent's /v1/events (the agent owns the one loaded probe; trace never loads BCC)."""

from __future__ import annotations

import json
import time

import click

from azprobe.commands.top import DEFAULT_AGENT, TOKEN_FILE_HELP, fetch_json, token_from_option


def format_event(event: dict) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(event["ts"])) + f".{int(event['ts'] % 1 * 1000):03d}"
    return (f"{stamp} {event['kind']:<13} {event['src']} -> {event['dst']:<10} "
            f"{event['saddr']}:{event['sport']} -> {event['daddr']}:{event['dport']}")


@click.command("trace")
@click.option("--agent", "agent_url", default=DEFAULT_AGENT, show_default=True, help="Agent base URL.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event.")
@click.option("--duration", default=0.0, type=click.FloatRange(0), help="Stop after this many seconds (0: never).")
@click.option("--poll", default=0.5, show_default=True, type=click.FloatRange(0.05, 10), help="Seconds between polls.")
@click.option("--token-file", type=click.Path(dir_okay=False), envvar="AZPROBE_AGENT_TOKEN_FILE",
              help=TOKEN_FILE_HELP)
def trace_command(agent_url: str, as_json: bool, duration: float, poll: float, token_file: str | None) -> None:
    """Print each SYN retransmit, RTO and failed connect as the agent sees it."""
    base = agent_url.rstrip("/")
    token = token_from_option(token_file)
    # Start from now: the agent's event ring holds history we do not replay.
    doc = fetch_json(f"{base}/v1/events?after=0", token=token)
    last_id = max((e["id"] for e in doc.get("events", [])), default=0)
    boot_id = doc.get("boot_id")
    if not as_json:
        click.echo(f"tracing {doc.get('node')} (az {doc.get('az')}): TIME KIND PATH ADDRESSES", err=True)
    deadline = time.monotonic() + duration if duration else None
    while deadline is None or time.monotonic() < deadline:
        time.sleep(poll)  # pacing the poll, not synchronising
        doc = fetch_json(f"{base}/v1/events?after={last_id}", token=token)
        if doc.get("boot_id") != boot_id:  # agent restarted: its event ids start over
            boot_id, last_id = doc.get("boot_id"), 0
            continue
        for event in doc.get("events", []):
            last_id = max(last_id, event["id"])
            click.echo(json.dumps(event, separators=(",", ":")) if as_json else format_event(event))
