"""Operator switches in Consul KV, read once per cycle with one recursive GET.

- `<prefix>control/freeze`: hold the current weights. Value: empty (or anything that is
  not JSON: frozen until the key is deleted) or `{"until": <unix s>, "reason": "..."}`.
- `<prefix>control/shift/<az>`: drain <az>, like a zonal shift, until an expiry. Value:
  `{"until": <unix s>, "reason": "..."}` or a bare number (the expiry). A shift must
  expire: one without a valid future `until` is ignored and reported, so a forgotten
  key can never drain a zone for ever.

Expired switches are ignored (they may linger in KV; the controller does not delete
operator keys). A shift's `until` may lie at most MAX_SHIFT_S (3 days, as AWS zonal
shifts) ahead: one further out is ignored and reported, not clipped (a clip relative to
`now` would never expire). A shift of an AZ outside the controller's topology is ignored
and reported. Key names and values come from KV: reported through `printable`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from azprobe.contracts import bounded_json, kv
from azprobe.contracts.window import printable
from azprobe.controller.safety import Controls

MAX_SHIFT_S = 3 * 86400.0


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


def parse_controls(entries: Mapping[str, bytes | None], control_prefix: str, now: float,
                   azs: Collection[str] | None = None) -> OperatorControls:
    """entries: full KV key -> value under `<prefix>control/` (a recursive read); `now`
    is unix time (expiries are unix seconds); `azs`: the topology's AZs (None: any)."""
    frozen, freeze_reason = False, ""
    shifts: dict[str, float] = {}
    problems: list[str] = []
    for key, raw in sorted(entries.items()):
        name = key[len(control_prefix):] if key.startswith(control_prefix) else key
        switch = kv.control_switch(kv.CONTROL + name) if name else None
        value = _decode(raw)
        if switch is not None and switch[0] == "freeze":
            until = _until(value.get("until")) if isinstance(value, dict) else None
            if until is not None and until <= now:
                continue
            frozen = True
            reason = value.get("reason") if isinstance(value, dict) else value
            freeze_reason = str(reason)[:200] if reason else "operator freeze"
        elif switch is not None and switch[1] is not None:
            az = switch[1]
            until = _until(value.get("until")) if isinstance(value, dict) else _until(value)
            shown = printable(key, 120)
            if until is None:
                problems.append(f"{shown}: ignored, needs {{\"until\": <unix seconds>}}")
                continue
            if until <= now:
                continue
            if until > now + MAX_SHIFT_S:
                problems.append(f"{shown}: ignored, until is {(until - now) / 3600:.0f} h ahead; a shift lasts at "
                                f"most {MAX_SHIFT_S / 3600:.0f} h (3 days): set an earlier until")
                continue
            if azs is not None and az not in azs:
                problems.append(f"{shown}: ignored, {printable(az, 64)!r} is not an AZ of the topology "
                                f"({', '.join(sorted(azs)) or 'none yet'})")
                continue
            shifts[az] = until
        elif name:
            problems.append(f"{printable(key, 120)}: unknown control key ignored")
    return OperatorControls(Controls(freeze=frozen, shifts=shifts), freeze_reason, tuple(problems))
