"""Operator switches in Consul KV, read once per cycle with one recursive GET.

- `<prefix>control/freeze`: hold the current weights. Value: empty (or anything that is
  not JSON: frozen until the key is deleted) or `{"until": <unix s>, "reason": "..."}`.
- `<prefix>control/shift/<az>`: drain <az>, like a zonal shift, until an expiry. Value:
  `{"until": <unix s>, "reason": "..."}` or a bare number (the expiry). A shift must
  expire: one without a valid future `until` is ignored and reported, so a forgotten
  key can never drain a zone for ever.

Expired switches are ignored (they may linger in KV; the controller does not delete
operator keys).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from azprobe.contracts import kv
from azprobe.controller.safety import Controls


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
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace").strip()


def _until(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def parse_controls(entries: Mapping[str, bytes | None], control_prefix: str, now: float) -> OperatorControls:
    """entries: full KV key -> value under `<prefix>control/` (a recursive read); `now`
    is unix time (expiries are unix seconds)."""
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
            if until is None:
                problems.append(f"{key}: ignored, needs {{\"until\": <unix seconds>}}")
                continue
            if until > now:
                shifts[az] = until
        elif name:
            problems.append(f"{key}: unknown control key ignored")
    return OperatorControls(Controls(freeze=frozen, shifts=shifts), freeze_reason, tuple(problems))
