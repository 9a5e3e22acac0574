"""Pure parts of publishing: when a write is due, what expires_at is, document validation,
operator controls parsing, and the agent HTTP client's chunked decoding."""

from __future__ import annotations

import json


from azprobe.clients.consul import ConsulSettings
from azprobe.contracts.weights import ZoneWeights, parse_weights
from azprobe.controller.controls import parse_controls
from azprobe.controller.publish import GLOBAL_VIEW, Publisher, WeightsView


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _zone(share: int, state: str = "ok") -> ZoneWeights:
    return ZoneWeights(weight=1.0, share=share, health=1.0, success=None, p95_ms=None, util=None, samples=0,
                       state=state, reasons=())


def _views(a: int, b: int, state: str = "ok") -> dict[str, WeightsView]:
    return {GLOBAL_VIEW: WeightsView(state, {"az-a": _zone(a), "az-b": _zone(b)})}


def _publisher(clock: Clock) -> Publisher:
    return Publisher(client=None, settings=ConsulSettings(), leader_name="t", model_name="default",  # type: ignore[arg-type]
                     heartbeat_s=30.0, expiry_s=90.0, clock=clock, wall=lambda: 1000.0)


def test_due_on_first_write_share_move_state_change_and_heartbeat():
    clock = Clock()
    p = _publisher(clock)
    assert p.due(_views(50, 50)) == "first write of this term"
    p._last_signatures = {name: v.signature() for name, v in _views(50, 50).items()}
    p._last_write_at = clock.now
    assert p.due(_views(50, 50)) is None
    assert p.due(_views(51, 49)) == "shares or states changed"  # one point is enough
    assert p.due(_views(50, 50, state="frozen")) == "shares or states changed"
    clock.now += 29.9
    assert p.due(_views(50, 50)) is None
    clock.now += 0.1
    assert p.due(_views(50, 50)) == "heartbeat"


def test_build_stamps_and_validates_documents():
    p = _publisher(Clock())
    docs = p.build(_views(60, 40), generation=7, now=1000.0)
    doc = parse_weights(docs[GLOBAL_VIEW].dumps())
    assert (doc.generation, doc.generated_at, doc.expires_at, doc.leader) == (7, 1000.0, 1090.0, "t")


def test_expiry_covers_heartbeats_and_a_failover():
    assert Publisher.expiry_for(heartbeat_s=30, session_ttl_s=10, lock_delay_s=15, interval_s=1) == 90
    # a long lock-delay: the document must outlive a whole fail-over (2 x TTL + delay + cycles)
    assert Publisher.expiry_for(heartbeat_s=5, session_ttl_s=10, lock_delay_s=60, interval_s=1) == 83


def test_controls_freeze_shift_and_expiry():
    prefix = "azprobe/v1/control/"
    now = 1000.0
    entries = {
        prefix + "freeze": b"",
        prefix + "shift/az-b": json.dumps({"until": 2000, "reason": "maintenance"}).encode(),
        prefix + "shift/az-c": b"999",  # expired: ignored
        prefix + "shift/az-d": b'{"reason": "forever"}',  # no expiry: refused
        prefix + "typo": b"1",
    }
    parsed = parse_controls(entries, prefix, now, ("az-a", "az-b", "az-c", "az-d"))
    assert parsed.controls.freeze is True and parsed.freeze_reason == "operator freeze"
    assert dict(parsed.controls.shifts) == {"az-b": 2000.0}
    assert len(parsed.problems) == 2 and "shift/az-d" in parsed.problems[0] and "typo" in parsed.problems[1]
    expired = parse_controls({prefix + "freeze": b'{"until": 10}'}, prefix, now, ("az-a",))
    assert expired.controls.freeze is False
