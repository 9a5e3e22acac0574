"""Operator switches in Consul KV, read once per cycle with one recursive GET.

- `<prefix>control/freeze`: hold the current weights. Value: empty (or anything that is
  not a JSON object with `until`: frozen until the key is deleted) or
  `{"until": <unix s>, "reason": "..."}`.
- `<prefix>control/shift/<az>`: drain <az>, like a zonal shift, until an expiry. Value:
  `{"until": <unix s>, "reason": "..."}` or a bare number (the expiry). A shift must
  expire: one without a valid future `until` is ignored and reported, so a forgotten
  key can never drain a zone for ever.
- `<prefix>control/host/<addr>`: the operator says host <addr> (an IPv4 or IPv6
  address) is healthy: the controller does not name it, so no data plane demotes it.
  Value as a shift's, and like a shift it must expire: a pin is a claim about one host
  that goes stale as the host changes, so a forgotten one must not hide that host's next
  real failure. At most MAX_HOST_PINS pins (by key order); the others are ignored and
  reported. A pin only ever removes a host from the list (controller/hosts.py).
- `<prefix>control/hosts-off`: name no host and judge zones as if no agent sent host
  evidence. Value as a freeze's (open-ended unless it has an `until`): it is a mode of the
  whole controller, shown in every zone's reasons and by a gauge, as a freeze is.

Expired switches are ignored (they may linger in KV; the controller does not delete
operator keys). An `until`, of any switch, may lie at most MAX_UNTIL_S (3 days, as AWS
zonal shifts) ahead: a switch further out, or whose `until` is not a number, is ignored
and reported, not clipped (a clip relative to `now` would never expire; an `until` of
1e300 or in milliseconds is a mistake, not a plan). A shift of an AZ outside the
controller's topology is ignored and reported, and so is a key whose reading fails in
any other way: one key never fails the read of the others. Key names and values come
from KV: reported through `printable`, and every ignored key is counted (`ignored`, the
gauge azprobe_controller_control_keys_ignored); at most MAX_PROBLEMS of them are
described.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from azprobe.contracts import bounded_json, kv
from azprobe.contracts.window import MAX_ADDRESS_LEN, printable
from azprobe.controller.safety import Controls, HostPin

MAX_UNTIL_S = 3 * 86400.0
MAX_HOST_PINS = 64
MAX_REASON_CHARS = 200  # an operator's reason, as kept and shown
MAX_PROBLEMS = 32  # ignored keys described (and logged); every one is counted


@dataclass(frozen=True)
class OperatorControls:
    """The switches in force now (as the safety rules and the host judgement take them)
    and what was ignored."""

    controls: Controls = field(default_factory=Controls)
    freeze_reason: str = ""
    problems: tuple[str, ...] = ()
    ignored: int = 0  # keys ignored at this read, described or not


def _decode(raw: bytes | None) -> object:
    if not raw:
        return None
    try:
        return bounded_json.loads(raw, max_bytes=kv.MAX_VALUE_BYTES, what="control value")
    except bounded_json.JsonRefused:
        return raw.decode("utf-8", "replace").strip()


def _until(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:  # a JSON integer has no bound: float() of one past 1.8e308 raises OverflowError
        until = float(value)
    except OverflowError:
        return None
    return until if math.isfinite(until) else None


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


def _reason(value: object, default: str) -> str:
    reason = value.get("reason") if isinstance(value, dict) else value
    return printable(str(reason), MAX_REASON_CHARS) if reason else default


def _address(text: str) -> str | None:
    """The canonical text of an IPv4 or IPv6 address, or None (a zone id is no host's)."""
    if not 0 < len(text) <= MAX_ADDRESS_LEN or "%" in text:
        return None
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


class _Reading:
    """The switches found so far in one read, and what was refused."""

    def __init__(self, now: float, azs: Collection[str]) -> None:
        self.now, self.azs = now, azs
        self.frozen, self.freeze_reason = False, ""
        self.off, self.off_reason = False, ""
        self.shifts: dict[str, float] = {}
        self.pins: dict[str, HostPin] = {}
        self.problems: list[str] = []
        self.ignored = 0

    def refuse(self, key: str, why: str) -> None:
        self.ignored += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"{printable(key, 120)}: {why}")

    def held(self, key: str, value: object, what: str) -> bool:
        """An open-ended switch (freeze, hosts-off): in force unless it has an `until`
        that has passed; a bad `until` is refused."""
        if isinstance(value, dict) and "until" in value:
            until = _until_or_problem(value["until"], self.now, what, "or none: in force until deleted")
            if isinstance(until, str):
                self.refuse(key, f"ignored, {until}")
                return False
            return until > self.now
        return True

    def expiring(self, key: str, value: object, what: str) -> float | None:
        """A switch that must expire (shift, host pin): its `until` while in force."""
        until = _until_or_problem(value.get("until") if isinstance(value, dict) else value, self.now, what,
                                  f"{what} must expire")
        if isinstance(until, str):
            self.refuse(key, f"ignored, {until}")
            return None
        return until if until > self.now else None

    def shift(self, key: str, az: str, value: object) -> None:
        until = self.expiring(key, value, "a shift")
        if until is None:
            return
        if az not in self.azs:
            self.refuse(key, f"ignored, {printable(az, 64)!r} is not an AZ of the topology ({', '.join(sorted(self.azs))})")
            return
        self.shifts[az] = until

    def pin(self, key: str, text: str, value: object) -> None:
        addr = _address(text)
        if addr is None:
            self.refuse(key, f"ignored, {printable(text, 64)!r} is not an IPv4 or IPv6 address "
                             "(control/host/<address>, e.g. control/host/198.18.2.12)")
            return
        until = self.expiring(key, value, "a host pin")
        if until is None:
            return
        if addr not in self.pins and len(self.pins) >= MAX_HOST_PINS:
            self.refuse(key, f"ignored, at most {MAX_HOST_PINS} host pins are honoured (delete some)")
            return
        before = self.pins.get(addr)
        if before is None or until > before.until:
            self.pins[addr] = HostPin(addr, until, _reason(value, ""))

    def controls(self) -> OperatorControls:
        controls = Controls(freeze=self.frozen, shifts=MappingProxyType(self.shifts),
                            host_pins=MappingProxyType(self.pins), hosts_off=self.off,
                            hosts_off_reason=self.off_reason)
        return OperatorControls(controls, self.freeze_reason, tuple(self.problems), self.ignored)


def parse_controls(entries: Mapping[str, bytes | None], control_prefix: str, now: float,
                   azs: Collection[str]) -> OperatorControls:
    """entries: full KV key -> value under `<prefix>control/` (a recursive read); `now`
    is unix time (expiries are unix seconds); `azs`: the topology's AZs."""
    reading = _Reading(now, azs)
    for key, raw in sorted(entries.items()):
        # One key is one operator's (or one writer's) word: whatever it holds, a failure
        # reading it refuses that key alone. Raising here would fail the whole Consul
        # round, every round, so a new leader would never write and deleted switches
        # would stay in force.
        try:
            _parse_key(reading, key, raw, control_prefix)
        except Exception as exc:  # noqa: BLE001 - any failure of one key refuses that key
            reading.refuse(key, f"ignored, its value could not be read ({type(exc).__name__}): "
                                "rewrite it as documented (docs/operations.md)")
    return reading.controls()


def _parse_key(reading: _Reading, key: str, raw: bytes | None, control_prefix: str) -> None:
    name = key[len(control_prefix):] if key.startswith(control_prefix) else key
    switch = kv.control_switch(kv.CONTROL + name) if name else None
    if switch is None:
        if name:
            reading.refuse(key, "unknown control key ignored")
        return
    kind, arg = switch
    value = _decode(raw)
    # The reason first: a switch is in force only once all of it has been read.
    if kind == "freeze" and reading.held(key, value, "a freeze"):
        reason = _reason(value, "operator freeze")
        reading.frozen, reading.freeze_reason = True, reason
    elif kind == "hosts-off" and reading.held(key, value, "hosts-off"):
        reason = _reason(value, "")
        reading.off, reading.off_reason = True, reason
    elif kind == "shift" and arg is not None:
        reading.shift(key, arg, value)
    elif kind == "host" and arg is not None:
        reading.pin(key, arg, value)

