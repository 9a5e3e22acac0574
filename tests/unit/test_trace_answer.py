"""`azprobe trace` reads /v1/events from the network: every field the agent writes
(agent/events.py) is checked before it is printed, and a bad one is named."""

from __future__ import annotations

import pytest

from azprobe.commands import trace
from azprobe.contracts.window import WindowError
from azprobe.errors import ConfigError

EVENT = {"id": 7, "ts": 1700000000.25, "kind": "conn_refused", "src": "az-a", "dst": "az-b",
         "saddr": "198.18.1.2", "sport": 40000, "daddr": "2001:db8::5", "dport": 443}


def answer(events: list | tuple = (), **header: object) -> dict:
    return {"node": "node-a1", "az": "az-a", "boot_id": "b-1", "events": list(events), **header}


def test_a_good_answer_parses():
    got = trace.parse_events_answer(answer((EVENT,)))
    assert (got.node, got.az, got.boot_id) == ("node-a1", "az-a", "b-1")
    [event] = got.events
    assert (event.id, event.kind, event.daddr, event.dport) == (7, "conn_refused", "2001:db8::5", 443)
    line = trace.format_event(event)
    assert "conn_refused" in line and "az-a -> az-b" in line and "198.18.1.2:40000 -> 2001:db8::5:443" in line


def test_the_agents_own_events_parse():
    from azprobe.agent.events import EventLog
    from azprobe.agent.probe import ProbeEvent

    log = EventLog()
    log.record(ProbeEvent(ts_ns=1, kind="rto", src_az_id=1, dst_az_id=2, saddr="10.0.0.1", sport=1,
                          daddr="::1", dport=2), {1: "az-a", 2: "other"}.get)
    [event] = trace.parse_events_answer(answer(log.after(0))).events
    assert (event.kind, event.src, event.dst) == ("rto", "az-a", "other")


def test_the_cap_holds_the_agents_ring():
    from azprobe.agent.events import EVENT_RING_SIZE

    assert trace.MAX_EVENTS >= EVENT_RING_SIZE


@pytest.mark.parametrize(("doc", "field"), [
    ([], "response: expected a JSON object"),
    ({"events": "abc", "boot_id": "b"}, "events: expected a list"),
    ({"boot_id": "b"}, "events: expected a list"),
    (answer([{"x": 1}]), "events[0].ts:"),
    (answer(["e"]), "events[0]: expected an object"),
    (answer([{**EVENT, "id": "zz"}]), "events[0].id:"),
    (answer([{**EVENT, "id": True}]), "events[0].id:"),
    (answer([{**EVENT, "id": 0}]), "events[0].id:"),
    (answer([EVENT, {**EVENT, "ts": "now"}]), "events[1].ts:"),
    (answer([{**EVENT, "ts": float("nan")}]), "events[0].ts:"),
    (answer([{**EVENT, "ts": 1e300}]), "events[0].ts:"),  # time.localtime would overflow
    (answer([{**EVENT, "kind": "\x1b[2J"}]), "events[0].kind:"),
    (answer([{**EVENT, "src": 3}]), "events[0].src:"),
    (answer([{**EVENT, "dst": "a" * 64}]), "events[0].dst:"),
    (answer([{**EVENT, "saddr": "10.0.0.1\x1b[31m"}]), "events[0].saddr:"),
    (answer([{**EVENT, "daddr": "010.0.0.1"}]), "events[0].daddr:"),
    (answer([{**EVENT, "sport": 70000}]), "events[0].sport:"),
    (answer([{**EVENT, "dport": -1}]), "events[0].dport:"),
    (answer([EVENT] * (trace.MAX_EVENTS + 1)), "events: 4097 events exceed 4096"),
    (answer(node="\x1b]0;owned\x07"), "response: node"),
    (answer(boot_id=None), "response: boot_id"),
])
def test_a_bad_answer_names_the_field(doc, field):
    with pytest.raises(WindowError) as err:
        trace.parse_events_answer(doc)
    message = str(err.value)
    assert message.startswith(field), message
    assert message.isascii() and message.isprintable() and len(message) < 300


def test_the_agent_url_is_checked_as_top_checks_it():
    with pytest.raises(ConfigError) as err:
        trace.EventsReader("notaurl")
    assert err.value.exit_code == 2
    assert str(err.value) == "--agent: 'notaurl' is not an http(s) URL (for example http://127.0.0.1:9740)"
