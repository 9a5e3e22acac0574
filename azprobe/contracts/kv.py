"""The Consul KV key layout (docs/contracts.md "KV layout"): the one place that names keys.

Names are relative to the prefix (default ``azprobe/v1/``); `ConsulSettings.key(name)`
puts the prefix in front::

    <prefix>leader               the controllers' lock (a Consul session holds it)
    <prefix>weights              the global weights document
    <prefix>weights/from/<src>   the weights document as seen from source AZ <src>
    <prefix>hosts                the sick-hosts document: every view's named hosts
    <prefix>control/freeze       operator switch: hold the current weights
    <prefix>control/shift/<az>   operator switch: drain <az> until an expiry
    <prefix>control/host/<addr>  operator switch: host <addr> is healthy (never named) until an expiry
    <prefix>control/hosts-off    operator switch: name no host, judge zones without host evidence
    <prefix>doctor/<host>        `azprobe doctor`'s write/read/delete probe
"""

from __future__ import annotations

DEFAULT_PREFIX = "azprobe/v1/"
LEADER = "leader"
WEIGHTS = "weights"
WEIGHTS_FROM = "weights/from/"
HOSTS = "hosts"
CONTROL = "control/"
FREEZE = CONTROL + "freeze"
SHIFT = CONTROL + "shift/"
HOST_PIN = CONTROL + "host/"
HOSTS_OFF = CONTROL + "hosts-off"
DOCTOR = "doctor/"
MAX_AZ_NAME = 256
MAX_VALUE_BYTES = 512 * 1024  # Consul's kv_max_value_size default: no value read from KV is larger


def is_az_name(name: object) -> bool:
    """Whether `name` can be one path segment of a key: non-empty, no '/', bounded."""
    return isinstance(name, str) and 0 < len(name) <= MAX_AZ_NAME and "/" not in name


def weights_name(source_az: str | None = None) -> str:
    """The global document's name, or the one seen from `source_az` (a valid AZ name)."""
    if source_az is None:
        return WEIGHTS
    if not is_az_name(source_az):
        raise ValueError(f"{source_az!r} is not an AZ name")
    return WEIGHTS_FROM + source_az


def shift_name(az: str) -> str:
    """The operator shift switch of `az`."""
    if not is_az_name(az):
        raise ValueError(f"{az!r} is not an AZ name")
    return SHIFT + az


def host_pin_name(addr: str) -> str:
    """The operator switch that pins host `addr` (an IP address's text) as healthy."""
    if not is_az_name(addr):
        raise ValueError(f"{addr!r} is not an address")
    return HOST_PIN + addr


def doctor_name(host: str) -> str:
    """The key `azprobe doctor` writes, reads back and deletes to check the token."""
    return DOCTOR + host.replace("/", "_")


def control_switch(name: str) -> tuple[str, str | None] | None:
    """A key name under CONTROL (without the prefix) -> ("freeze", None), ("shift", az),
    ("host", addr), ("hosts-off", None), or None for a name that is no switch."""
    if name in (FREEZE, HOSTS_OFF):
        return name[len(CONTROL):], None
    for kind, start in (("shift", SHIFT), ("host", HOST_PIN)):
        if name.startswith(start) and len(name) > len(start):
            return kind, name[len(start):]
    return None
