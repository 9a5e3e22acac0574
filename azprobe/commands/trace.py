"""`azprobe trace`: a live view of SYN retransmits, RTOs and failed connects, read from the
agent's /v1/events (the agent owns the one loaded probe; trace never loads BCC).

The answer comes from the network, and what trace prints reaches a terminal: every event
is checked field by field against what the agent writes (agent/events.py), and a bad
answer is one line naming the field, as `azprobe top` says of a bad /v1/windows answer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import click

from azprobe.clients.transport import Endpoint, HttpError
from azprobe.commands.top import DEFAULT_AGENT, TOKEN_FILE_HELP, fetch_json, token_from_option
from azprobe.contracts.window import (MAX_AZ_NAME, MAX_SEQ, WindowError, is_canonical_address, name_problem,
                                      printable)
from azprobe.contracts.windowcodec import page_from_doc
from azprobe.errors import ConfigError, PrerequisiteError

# The agent's ring keeps 1000 events (agent/events.py EVENT_RING_SIZE), so no answer holds
# more; the cap leaves a bigger ring room and bounds the work a hostile peer can ask for.
MAX_EVENTS = 4096
MAX_KIND = 32  # "syn_retrans", "rto", "connect_timeout", ...; an unknown kind is its number
# 9999-12-31T23:59:59Z: time.localtime takes any stamp up to it (past it, OverflowError).
MAX_TS = 253402300799.0


@dataclass(frozen=True)
class Event:
    id: int
    ts: float
    kind: str
    src: str
    dst: str
    saddr: str
    sport: int
    daddr: str
    dport: int


@dataclass(frozen=True)
class EventsAnswer:
    node: str
    az: str
    boot_id: str
    events: list[Event]


def _integer(doc: Mapping, key: str, where: str, lo: int, hi: int) -> int:
    value = doc.get(key)
    if type(value) is not int or not lo <= value <= hi:
        raise WindowError(f"{where}.{key}: expected an integer {lo}..{hi}, got {printable(value, 40)}")
    return value


def _name(doc: Mapping, key: str, where: str, limit: int) -> str:
    value = doc.get(key)
    problem = name_problem(value, limit)
    if problem:
        raise WindowError(f"{where}.{key}: {printable(value, 40)!r} {problem}")
    return value


def _address(doc: Mapping, key: str, where: str) -> str:
    value = doc.get(key)
    if not is_canonical_address(value):
        raise WindowError(f"{where}.{key}: {printable(value, 40)!r} is not an IPv4 or IPv6 address in canonical form")
    return value


def parse_event(doc: object, where: str) -> Event:
    if not isinstance(doc, Mapping):
        raise WindowError(f"{where}: expected an object")
    ts = doc.get("ts")
    if type(ts) not in (int, float) or not 0 <= ts <= MAX_TS:  # NaN and infinities compare false
        raise WindowError(f"{where}.ts: expected seconds since the epoch, got {printable(ts, 40)}")
    return Event(id=_integer(doc, "id", where, 1, MAX_SEQ), ts=float(ts), kind=_name(doc, "kind", where, MAX_KIND),
                 src=_name(doc, "src", where, MAX_AZ_NAME), dst=_name(doc, "dst", where, MAX_AZ_NAME),
                 saddr=_address(doc, "saddr", where), sport=_integer(doc, "sport", where, 0, 65535),
                 daddr=_address(doc, "daddr", where), dport=_integer(doc, "dport", where, 0, 65535))


def parse_events_answer(doc: object) -> EventsAnswer:
    """A /v1/events answer: {node, az, boot_id} under the rule of a /v1/windows page
    (windowcodec), and at most MAX_EVENTS events. Raises WindowError naming the field."""
    if not isinstance(doc, Mapping):
        raise WindowError("response: expected a JSON object {node, az, boot_id, events: [...]}")
    if not isinstance(doc.get("events"), list):
        raise WindowError(f"events: expected a list of events, got {printable(doc.get('events'), 40)}")
    header = page_from_doc({"node": doc.get("node"), "az": doc.get("az"), "boot_id": doc.get("boot_id"),
                            "windows": []})
    raw = doc["events"]
    if len(raw) > MAX_EVENTS:
        raise WindowError(f"events: {len(raw)} events exceed {MAX_EVENTS}")
    return EventsAnswer(header.node, header.az, header.boot_id,
                        [parse_event(e, f"events[{i}]") for i, e in enumerate(raw)])


def format_event(event: Event) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(event.ts)) + f".{int(event.ts % 1 * 1000):03d}"
    return (f"{stamp} {printable(event.kind, MAX_KIND):<13} {printable(event.src)} -> {printable(event.dst):<10} "
            f"{printable(event.saddr)}:{event.sport} -> {printable(event.daddr)}:{event.dport}")


class EventsReader:
    """One agent's /v1/events, each answer checked (parse_events_answer)."""

    def __init__(self, agent_url: str, token: str = "") -> None:
        try:
            Endpoint.parse(agent_url)  # the URL rules of `top` and the controller
        except HttpError as exc:
            raise ConfigError("--agent", str(exc), "for example http://127.0.0.1:9740") from None
        self.agent_url = agent_url.rstrip("/")
        self.token = token

    def read(self, after: int) -> EventsAnswer:
        doc = fetch_json(f"{self.agent_url}/v1/events?after={after}", token=self.token)
        try:
            return parse_events_answer(doc)
        except WindowError as exc:
            raise PrerequisiteError(f"agent {self.agent_url} sent a bad response: {exc}") from None


@click.command("trace")
@click.option("--agent", "agent_url", default=DEFAULT_AGENT, show_default=True, help="Agent base URL.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event.")
@click.option("--duration", default=0.0, type=click.FloatRange(0), help="Stop after this many seconds (0: never).")
@click.option("--poll", default=0.5, show_default=True, type=click.FloatRange(0.05, 10), help="Seconds between polls.")
@click.option("--token-file", type=click.Path(dir_okay=False), envvar="AZPROBE_AGENT_TOKEN_FILE",
              help=TOKEN_FILE_HELP)
def trace_command(agent_url: str, as_json: bool, duration: float, poll: float, token_file: str | None) -> None:
    """Print each SYN retransmit, RTO and failed connect as the agent sees it."""
    reader = EventsReader(agent_url, token=token_from_option(token_file))
    # Start from now: the agent's event ring holds history we do not replay.
    answer = reader.read(0)
    last_id = max((e.id for e in answer.events), default=0)
    boot_id = answer.boot_id
    if not as_json:
        click.echo(f"tracing {printable(answer.node, 64)} (az {printable(answer.az, 64)}): "
                   "TIME KIND PATH ADDRESSES", err=True)
    deadline = time.monotonic() + duration if duration else None
    while deadline is None or time.monotonic() < deadline:
        time.sleep(poll)  # pacing the poll, not synchronising
        answer = reader.read(last_id)
        if answer.boot_id != boot_id:  # agent restarted: its event ids start over
            boot_id, last_id = answer.boot_id, 0
            continue
        for event in answer.events:
            last_id = max(last_id, event.id)
            click.echo(json.dumps(asdict(event), separators=(",", ":")) if as_json else format_event(event))
