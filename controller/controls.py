"""Operator switches in Consul KV, read once per cycle with one recursive GET.

- `<prefix>control/freeze`: hold the current weights. Value: empty (or anything that is
  not a JSON object with `until`: frozen until the key is deleted) or
  `{"until": <unix s>, "reason": "..."}`.
- `<prefix>control/shift/<az>`: drain <az>, like a zonal shift, until an expiry. Value:
  `{"until": <unix s>, "reason": "..."}` or a bare number (the expiry). A shift must
  expire: one without a valid future `until` is ignored and reported, so a forgotten
  key can never drain a zone for ever.

Expired switches are ignored (they may linger in KV; the controller does not delete
operator keys). An `until`, of a freeze or a shift, may lie at most MAX_UNTIL_S (3 days,
as AWS zonal shifts) ahead: a switch further out, or whose `until` is not a number, is
ignored and reported, not clipped (a clip relative to `now` would never expire; an
`until` of 1e300 or in milliseconds is a mistake, not a plan). A shift of an AZ outside
the controller's topology is ignored and reported. Key names and values come from KV:
reported through `printable`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from azprobe.contracts import bounded_json, kv
from azprobe.contracts.window import printable
from azprobe.controller.safety import Controls

MAX_UNTIL_S = 3 * 86400.0


@dataclass(frozen=True)
class OperatorControls:
    """The switches in force now (as the safety rules take them) and what was ignored."""

    controls: Controls = field(default_factory=Controls)
    freeze_reason: str = ""
    problems: tuple[str, ...] = ()


def _decode(raw: bytes | None) -> object:
    if not raw:
        return None
    try:
        return bounded_json.loads(raw, max_bytes=kv.MAX_VALUE_BYTES, what="control value")
    except bounded_json.JsonRefused:
        return raw.decode("utf-8", "replace").strip()


def _until(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _until_or_problem(value: object, now: float, what: str, otherwise: str) -> float | str:
    """A switch's `until` as unix seconds (in the past: the switch has expired), or why it
    is refused: not a number, or more than MAX_UNTIL_S ahead."""
    until = _until(value)
    if until is None:
        return f'needs {{"until": <unix seconds>}} ({otherwise})'
    if until > now + MAX_UNTIL_S:
        return (f"until is {(until - now) / 3600:.3g} h ahead; {what} lasts at most {MAX_UNTIL_S / 3600:.0f} h "
                f"(3 days): set an earlier until ({otherwise})")
    return until


def parse_controls(entries: Mapping[str, bytes | None], control_prefix: str, now: float,
                   azs: Collection[str]) -> OperatorControls:
    """entries: full KV key -> value under `<prefix>control/` (a recursive read); `now`
    is unix time (expiries are unix seconds); `azs`: the topology's AZs."""
    frozen, freeze_reason = False, ""
    shifts: dict[str, float] = {}
    problems: list[str] = []
    for key, raw in sorted(entries.items()):
        name = key[len(control_prefix):] if key.startswith(control_prefix) else key
        switch = kv.control_switch(kv.CONTROL + name) if name else None
        value = _decode(raw)
        if switch is not None and switch[0] == "freeze":
            if isinstance(value, dict) and "until" in value:
                until = _until_or_problem(value["until"], now, "a freeze", "or none: frozen until deleted")
                if isinstance(until, str):
                    problems.append(f"{printable(key, 120)}: ignored, {until}")
                    continue
                if until <= now:
                    continue
            frozen = True
            reason = value.get("reason") if isinstance(value, dict) else value
            freeze_reason = str(reason)[:200] if reason else "operator freeze"
        elif switch is not None and switch[1] is not None:
            az = switch[1]
            until = _until_or_problem(value.get("until") if isinstance(value, dict) else value, now, "a shift",
                                      "a shift must expire")
            shown = printable(key, 120)
            if isinstance(until, str):
                problems.append(f"{shown}: ignored, {until}")
                continue
            if until <= now:
                continue
            if az not in azs:
                problems.append(f"{shown}: ignored, {printable(az, 64)!r} is not an AZ of the topology "
                                f"({', '.join(sorted(azs))})")
                continue
            shifts[az] = until
        elif name:
            problems.append(f"{printable(key, 120)}: unknown control key ignored")
    return OperatorControls(Controls(freeze=frozen, shifts=shifts), freeze_reason, tuple(problems))
