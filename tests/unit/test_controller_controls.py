"""Operator switches are bounded: a freeze's or a shift's `until` at most 3 days ahead,
shifts only of AZs of the topology, and names from KV never reach a log line with
control characters."""

from __future__ import annotations

import json

import pytest

from azprobe.controller.controls import MAX_UNTIL_S, parse_controls

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
