"""Operator switches are bounded: a freeze's, a shift's or a host pin's `until` at most 3
days ahead, shifts only of AZs of the topology, pins only of addresses and at most
MAX_HOST_PINS, and names from KV never reach a log line with control characters."""

from __future__ import annotations

import json

import pytest

from azprobe.controller.controls import MAX_HOST_PINS, MAX_PROBLEMS, MAX_UNTIL_S, parse_controls

PREFIX = "azprobe/v1/control/"
NOW = 1_000_000.0
AZS = ("az-a", "az-b", "az-c")


def _shift(az: str, until: float) -> dict[str, bytes]:
    return {PREFIX + f"shift/{az}": json.dumps({"until": until}).encode()}


def test_a_shift_beyond_three_days_is_ignored_and_reported():
    parsed = parse_controls(_shift("az-b", NOW + MAX_UNTIL_S + 3600), PREFIX, NOW, AZS)
    assert dict(parsed.controls.shifts) == {}
    assert "at most 72 h" in parsed.problems[0]
    ok = parse_controls(_shift("az-b", NOW + MAX_UNTIL_S - 60), PREFIX, NOW, AZS)
    assert dict(ok.controls.shifts) == {"az-b": NOW + MAX_UNTIL_S - 60}


@pytest.mark.parametrize("until", [NOW + MAX_UNTIL_S + 3600, 1e300, "tomorrow", None])
def test_a_freeze_until_beyond_three_days_or_not_a_number_is_ignored_and_reported(until):
    freeze = {PREFIX + "freeze": json.dumps({"until": until, "reason": "x"}).encode()}
    parsed = parse_controls(freeze, PREFIX, NOW, AZS)
    assert parsed.controls.freeze is False
    assert len(parsed.problems) == 1 and parsed.problems[0].startswith(PREFIX + "freeze: ignored, ")
    assert len(parsed.problems[0]) < 200
    assert ("at most 72 h" if isinstance(until, float) else "needs {\"until\"") in parsed.problems[0]


def test_a_freeze_within_three_days_or_without_until_holds():
    within = {PREFIX + "freeze": json.dumps({"until": NOW + MAX_UNTIL_S - 60}).encode()}
    ok = parse_controls(within, PREFIX, NOW, AZS)
    assert ok.controls.freeze is True and ok.problems == ()
    for value in (b"", b"change freeze", b'{"reason": "until deleted"}'):
        held = parse_controls({PREFIX + "freeze": value}, PREFIX, NOW, AZS)
        assert held.controls.freeze is True and held.problems == ()


def test_a_shift_of_an_unknown_az_is_ignored_and_reported():
    parsed = parse_controls({**_shift("az-x", NOW + 600), **_shift("az-b", NOW + 600)}, PREFIX, NOW, AZS)
    assert dict(parsed.controls.shifts) == {"az-b": NOW + 600}
    assert len(parsed.problems) == 1 and "'az-x' is not an AZ of the topology" in parsed.problems[0]


def test_control_key_names_are_printable_in_problems():
    parsed = parse_controls({PREFIX + "typo\x1b[2J": b"1", **_shift("az\x07b", NOW + 600)}, PREFIX, NOW, AZS)
    assert parsed.problems and all(p.isprintable() and "\x1b" not in p for p in parsed.problems)


def test_a_deeply_nested_switch_value_is_an_ordinary_bad_value():
    """200 KB of [[[...]]]: a shift without an until (ignored, reported) and a freeze
    that holds, as any value that is not a JSON switch."""
    nested = b"[" * 100_000 + b"]" * 100_000
    parsed = parse_controls({PREFIX + "shift/az-b": nested, **_shift("az-c", NOW + 600)}, PREFIX, NOW, AZS)
    assert dict(parsed.controls.shifts) == {"az-c": NOW + 600}
    assert len(parsed.problems) == 1 and "needs {\"until\"" in parsed.problems[0]
    frozen = parse_controls({PREFIX + "freeze": nested}, PREFIX, NOW, AZS)
    assert frozen.controls.freeze and len(frozen.freeze_reason) <= 200


# --- host switches: control/host/<addr>, control/hosts-off

def _pin(addr: str, value: object) -> dict[str, bytes]:
    return {PREFIX + f"host/{addr}": json.dumps(value).encode() if not isinstance(value, bytes) else value}


def test_a_host_pin_holds_until_its_expiry_with_its_reason():
    parsed = parse_controls(_pin("198.18.2.12", {"until": NOW + 600, "reason": "swapped the NIC"}), PREFIX, NOW, AZS)
    pin = parsed.controls.host_pins["198.18.2.12"]
    assert (pin.until, pin.reason) == (NOW + 600, "swapped the NIC") and parsed.problems == () and parsed.ignored == 0
    bare = parse_controls(_pin("2001:2:0:120:0:0:0:102", NOW + 60), PREFIX, NOW, AZS)
    assert list(bare.controls.host_pins) == ["2001:2:0:120::102"]  # canonical, as the host list names it
    expired = parse_controls(_pin("198.18.2.12", {"until": NOW - 1}), PREFIX, NOW, AZS)
    assert dict(expired.controls.host_pins) == {} and expired.problems == ()


@pytest.mark.parametrize("value", [{"reason": "no until"}, b"forever", {"until": NOW + MAX_UNTIL_S + 60},
                                   {"until": 1e300}, {"until": True}, {"until": "soon"}])
def test_a_host_pin_must_expire_within_three_days(value):
    parsed = parse_controls(_pin("198.18.2.12", value), PREFIX, NOW, AZS)
    assert dict(parsed.controls.host_pins) == {} and parsed.ignored == 1
    assert parsed.problems[0].startswith(PREFIX + "host/198.18.2.12: ignored, ")
    assert "a host pin must expire" in parsed.problems[0]


@pytest.mark.parametrize("addr", ["web-3", "198.18.2.300", "198.18.2.012", "10.0.0.0/8", "fe80::1%eth0",
                                  "1" * 40, "198.18.2.12\x1b[2J"])
def test_a_host_pin_of_no_address_is_ignored_and_reported(addr):
    parsed = parse_controls({**_pin(addr, NOW + 60), **_pin("198.18.2.13", NOW + 60)}, PREFIX, NOW, AZS)
    assert list(parsed.controls.host_pins) == ["198.18.2.13"] and parsed.ignored == 1
    assert "is not an IPv4 or IPv6 address" in parsed.problems[0]
    assert all(p.isprintable() and "\x1b" not in p for p in parsed.problems)


def test_host_pins_are_bounded_and_every_ignored_key_is_counted():
    many = {}
    for i in range(MAX_HOST_PINS + 40):
        many.update(_pin(f"198.18.{i // 200}.{i % 200 + 1}", {"until": NOW + 60, "reason": "r" * 5000}))
    many.update({PREFIX + f"typo{i}": b"1" for i in range(MAX_PROBLEMS)})
    parsed = parse_controls(many, PREFIX, NOW, AZS)
    assert len(parsed.controls.host_pins) == MAX_HOST_PINS
    assert all(len(p.reason) <= 200 for p in parsed.controls.host_pins.values())
    assert parsed.ignored == 40 + MAX_PROBLEMS and len(parsed.problems) == MAX_PROBLEMS
    assert any(f"at most {MAX_HOST_PINS} host pins" in p for p in parsed.problems)


def test_a_pin_reason_from_kv_is_printable():
    parsed = parse_controls(_pin("198.18.2.12", {"until": NOW + 60, "reason": "ok\x1b[2J\nnext"}), PREFIX, NOW, AZS)
    reason = parsed.controls.host_pins["198.18.2.12"].reason
    assert reason.isprintable() and "\x1b" not in reason and "\n" not in reason


def test_hosts_off_is_open_ended_like_a_freeze_and_bounded_by_its_until():
    for value in (b"", b"probe bug", b'{"reason": "probe bug"}', json.dumps({"until": NOW + 60}).encode()):
        off = parse_controls({PREFIX + "hosts-off": value}, PREFIX, NOW, AZS)
        assert off.controls.hosts_off is True and off.problems == () and not off.controls.freeze
    assert parse_controls({PREFIX + "hosts-off": b'{"reason": "probe bug"}'}, PREFIX, NOW, AZS) \
        .controls.hosts_off_reason == "probe bug"
    expired = parse_controls({PREFIX + "hosts-off": json.dumps({"until": NOW - 1}).encode()}, PREFIX, NOW, AZS)
    assert expired.controls.hosts_off is False and expired.problems == ()
    far = parse_controls({PREFIX + "hosts-off": json.dumps({"until": NOW + MAX_UNTIL_S + 60}).encode()}, PREFIX,
                         NOW, AZS)
    assert far.controls.hosts_off is False and far.ignored == 1 and "at most 72 h" in far.problems[0]


def test_a_host_switch_value_that_is_garbage_never_raises():
    nested = b"[" * 100_000 + b"]" * 100_000
    for raw in (nested, b"\xff\xfe", b"{", b"null", b"[]", b"-1"):
        parsed = parse_controls({**_pin("198.18.2.12", raw), PREFIX + "hosts-off": raw}, PREFIX, NOW, AZS)
        assert dict(parsed.controls.host_pins) == {}


@pytest.mark.parametrize("until", [10**400, -(10**400)], ids=["huge", "minus-huge"])
def test_an_until_past_float_range_is_not_a_number(until):
    # float() of a JSON integer past 1.8e308 raises OverflowError; it must read as "not a
    # number" (refused), whatever the decoder lets through
    from azprobe.controller.controls import _until

    assert _until(until) is None
    assert _until(NOW + 60) == NOW + 60 and _until(float("inf")) is None


def test_one_key_that_fails_to_read_is_refused_and_the_others_apply(monkeypatch):
    # Whatever a key's failure (here one the parsing has no handler for), it refuses that
    # key alone: the freeze and the shift next to it stay in force.
    from azprobe.controller import controls

    bad = PREFIX + "host/198.18.2.12"
    decode = controls._decode

    def failing(raw):
        if raw == b"boom":
            raise OverflowError("int too large to convert to float")
        return decode(raw)

    monkeypatch.setattr(controls, "_decode", failing)
    entries = {PREFIX + "freeze": b"", bad: b"boom", **_shift("az-c", NOW + 600)}
    parsed = parse_controls(entries, PREFIX, NOW, AZS)
    assert parsed.controls.freeze is True and dict(parsed.controls.shifts) == {"az-c": NOW + 600}
    assert dict(parsed.controls.host_pins) == {} and parsed.ignored == 1
    assert parsed.problems == (f"{bad}: ignored, its value could not be read (OverflowError): "
                               "rewrite it as documented (docs/operations.md)",)
