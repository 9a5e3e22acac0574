"""Strict TOML config reading shared by the agent and the controller.

Every accessor names the full dotted field in its error, so a typo in a config file
becomes `azprobe: agent.intervl_s: unknown key (known: interval_s, listen, ring_size)`
and exit code 2, never a traceback or a silently ignored setting.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import pwd
import re
import stat
import struct
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from azprobe.contracts import bounded_json
from azprobe.contracts.window import AZ_NAME_FIX, az_name_problem, is_decimal, printable
from azprobe.errors import ConfigError


MAX_FILE_BYTES = 4 * 1024 * 1024  # an operator's file (config, endpoints, stats): far above any real one

# What tomllib reads as text, not structure: strings (multi-line ones end at the last
# three of a run of up to five quotes) and comments. Past tomllib's first syntax error
# nothing is read, so only text it accepts must be split as it splits it.
_TOML_TEXT = re.compile(rb"""
    \"\"\"(?:[^"\\]|\\[\s\S]?|"{1,2}(?!"))*(?:"{3,5}|\Z)
  | '\'\'(?:[^']|'{1,2}(?!'))*(?:'{3,5}|\Z)
  | "(?:[^"\\\n]|\\[\s\S]?)*(?:"|\Z|(?=\n))
  | '[^'\n]*(?:'|\Z|(?=\n))
  | \#[^\n]*
""", re.VERBOSE)  # every alternative matches once it starts: one linear pass
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def nul_in_path(field: str, path: str | Path) -> ConfigError:
    """The error for a path the kernel cannot take: os calls raise ValueError on a NUL."""
    return ConfigError(field, f"{printable(str(path), 200)!r} contains a NUL byte", "write the path without it")


def _open_regular(path: str | Path, field: str, name: str, fix: str, *, missing: str | None = None,
                  unreadable_fix: str = "") -> tuple[int, os.stat_result]:
    """An open descriptor of the regular file at `path`, and its stat; else a ConfigError
    on `field` naming the file as `name` (`missing`: the problem when it does not exist).
    O_NONBLOCK and the S_ISREG check: a FIFO at the path would hang a start or a SIGHUP's
    reload for ever; a NUL in the path is a config error, not a ValueError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        if missing is not None and isinstance(exc, FileNotFoundError):
            raise ConfigError(field, missing, fix) from None
        raise ConfigError(field, f"cannot read {name}: {exc.strerror or exc}", unreadable_fix) from None
    except ValueError:
        raise nul_in_path(field, path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(field, f"{name} is not a regular file", fix)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _read_regular(p: Path, field: str, name: str, missing: str, fix: str) -> bytes:
    """At most MAX_FILE_BYTES + 1 bytes of the regular file `p` (_open_regular)."""
    fd, _ = _open_regular(p, field, name, fix, missing=missing)
    with os.fdopen(fd, "rb") as f:
        return f.read(MAX_FILE_BYTES + 1)


def read_file(path: str | Path, field: str) -> bytes:
    """An operator's file, at most MAX_FILE_BYTES; a ConfigError on `field` otherwise."""
    p = Path(path)
    raw = _read_regular(p, field, str(p), f"{p}: file not found", "pass an existing file")
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(field, f"{p} is larger than {MAX_FILE_BYTES} bytes")
    return raw


def parse_toml(raw: bytes, field: str) -> dict[str, Any]:
    """TOML text nested at most bounded_json.MAX_DEPTH deep (tomllib recurses per
    level); a ConfigError on `field` for anything else."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(field, f"not valid TOML: not UTF-8 at byte {exc.start}") from None
    parens = _TOML_TEXT.sub(b"", raw).translate(None, _NOT_BRACKETS).translate(bounded_json.PARENS)
    depth = bounded_json.depth_over(parens, bounded_json.MAX_DEPTH)
    if depth is not None:
        raise ConfigError(field, f"not valid TOML: nested too deeply ({depth} levels, "
                                 f"the limit is {bounded_json.MAX_DEPTH})")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(field, f"not valid TOML: {exc}") from None


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file; a missing or unparsable file is a ConfigError naming it."""
    p = Path(path)
    raw = _read_regular(p, str(p), "config", "config file not found", "pass --config with an existing file")
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(str(p), f"config larger than {MAX_FILE_BYTES} bytes")
    return parse_toml(raw, str(p))


class Section:
    """A view of one config table that hands out typed values and tracks known keys."""

    def __init__(self, data: Any, name: str) -> None:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(name, f"expected a table, got {type(data).__name__}")
        self.data: Mapping[str, Any] = data
        self.name = name
        self._known: set[str] = set()

    def field(self, key: str) -> str:
        return f"{self.name}.{key}" if self.name else key

    def _get(self, key: str, default: Any) -> Any:
        self._known.add(key)
        return self.data.get(key, default)

    def section(self, key: str) -> "Section":
        return Section(self._get(key, {}), self.field(key))

    def has(self, key: str) -> bool:
        return key in self.data

    def string(self, key: str, default: str | None = None, *, required: bool = False) -> str:
        value = self._get(key, default)
        if value is None and required:
            raise ConfigError(self.field(key), "is required", f"set {self.field(key)} = \"...\"")
        if not isinstance(value, str) or (required and not value):
            raise ConfigError(self.field(key), f"expected a string, got {value!r}")
        return value

    def number(self, key: str, default: float, *, min: float = -math.inf, max: float = math.inf) -> float:
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:  # NaN
            raise ConfigError(self.field(key), f"expected a number, got {value!r:.40}")
        if not min <= value <= max:  # compared before float(): a TOML integer past a float's range overflows it
            raise ConfigError(self.field(key), f"{value!r:.40} is outside {min}..{max}")
        return float(value)

    def integer(self, key: str, default: int, *, min: int = -(2**63), max: int = 2**63) -> int:
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(self.field(key), f"expected an integer, got {value!r}")
        if not min <= value <= max:
            raise ConfigError(self.field(key), f"{value} is outside {min}..{max}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(self.field(key), f"expected true or false, got {value!r}")
        return value

    def string_list(self, key: str, default: Iterable[str] = ()) -> list[str]:
        value = self._get(key, list(default))
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(self.field(key), f"expected a list of strings, got {value!r}")
        return list(value)

    def reject_unknown(self) -> None:
        """Call after reading every key: anything left over is a typo or a stale key."""
        unknown = sorted(set(self.data) - self._known)
        if unknown:
            known = ", ".join(sorted(self._known)) or "none"
            raise ConfigError(self.field(unknown[0]), f"unknown key (known: {known})")


# POSIX ACL (acl(5)) as Linux stores it in this xattr: a version word, then entries of
# (tag u16, permissions u16, id u32). The tags that matter to who else may read a file.
_ACL_XATTR = "system.posix_acl_access"
_ACL_USER, _ACL_GROUP_OBJ, _ACL_GROUP, _ACL_MASK = 0x02, 0x04, 0x08, 0x10


MAX_SECRET_BYTES = 64 * 1024  # a token or key file; anything longer is the wrong file
MAX_TOKEN_BYTES = 4096


def read_token_file(path: str | Path, field: str) -> str:
    """A bearer or ACL token from a secret file (read_secret_file: mode 0600 or stricter):
    one token of printable characters, surrounding whitespace ignored. Raises ConfigError
    naming `field`."""
    raw = read_secret_file(path, field)
    token = raw.decode("utf-8", "replace").strip()
    if not token or len(raw) > MAX_TOKEN_BYTES or any(c.isspace() or not c.isprintable() for c in token):
        raise ConfigError(field, f"{path} must hold one token of printable characters without spaces "
                          f"(up to {MAX_TOKEN_BYTES} bytes)",
                          "write one random token (e.g. `openssl rand -hex 32`) to it, mode 0600")
    return token


def read_secret_file(path: str | Path, field: str) -> bytes:
    """The bytes of a token or key file (at most MAX_SECRET_BYTES).

    Refused, with a ConfigError naming `field`, the file, its mode and the fix, when it is
    not a regular file, when its owner is neither this user nor root (that user could
    swap the secret), or when anyone else may read or write it: group or other bits in
    its mode (mode & 0o077). A POSIX ACL makes the group bits its mask, so then the ACL
    itself decides: entries for this user are fine (systemd's LoadCredential= hands a
    service its credential as a root-owned 0400 file plus a read ACL for the service's
    user), any other user or group is refused. A root-owned file its group may only read
    is fine for a non-root reader in that group (PostgreSQL's rule for key files):
    Kubernetes mounts a Secret so, root:<fsGroup> 0440, for a pod that runs as non-root.
    """
    fd, st = _open_regular(path, field, str(path), "point it at a file of mode 0600",
                           unreadable_fix="point it at a readable file of mode 0600")
    try:
        mode = stat.S_IMODE(st.st_mode)
        euid = os.geteuid()
        if st.st_uid not in (euid, 0):
            raise ConfigError(field, f"{path} is owned by uid {st.st_uid}, not by this user (uid {euid}) or root",
                              f"chown {_user_name(euid)} {path}")
        acl = _acl_entries(fd)
        if mode & 0o007 or (mode & 0o070 and not _root_group_read(st, acl, euid) and _acl_grants_others(acl, euid)):
            raise ConfigError(field, f"{path} has mode {mode:04o}{' and an ACL' if acl else ''}: "
                              "other users may read or write it",
                              f"setfacl -b {path} && chmod 600 {path}" if acl else f"chmod 600 {path}")
        raw = b""
        while len(raw) <= MAX_SECRET_BYTES and (chunk := os.read(fd, MAX_SECRET_BYTES + 1 - len(raw))):
            raw += chunk
    except OSError as exc:
        raise ConfigError(field, f"cannot read {path}: {exc.strerror or exc}",
                          "point it at a readable file of mode 0600") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_SECRET_BYTES:
        raise ConfigError(field, f"{path} is over {MAX_SECRET_BYTES} bytes: not a token or key",
                          "point it at the secret's own file")
    return raw


def _acl_entries(fd: int) -> list[tuple[int, int, int]] | None:
    """(tag, permissions, id) of the file's access ACL; None without one."""
    try:
        raw = os.getxattr(fd, _ACL_XATTR)
    except OSError:  # ENODATA: no ACL; ENOTSUP: the filesystem has none
        return None
    return [struct.unpack_from("<HHI", raw, offset) for offset in range(4, len(raw) - 7, 8)]


def _root_group_read(st: os.stat_result, acl: list[tuple[int, int, int]] | None, euid: int) -> bool:
    """A non-root reader's root-owned file, readable (not writable) by its group, no ACL,
    and the group is one of the reader's. Root needs no group to read: for root the group
    bits are only others' access."""
    mode = stat.S_IMODE(st.st_mode)
    return (euid != 0 and st.st_uid == 0 and acl is None and not mode & 0o020
            and st.st_gid in {os.getegid(), *os.getgroups()})


def _acl_grants_others(acl: list[tuple[int, int, int]] | None, euid: int) -> bool:
    """Group bits are set: without an ACL they are the group's access; with one they are
    its mask, and what counts is what the entries grant through it to anyone else."""
    if acl is None:
        return True
    mask = next((perm for tag, perm, _ in acl if tag == _ACL_MASK), 0o7)
    return any(perm & mask for tag, perm, uid in acl
               if tag in (_ACL_GROUP_OBJ, _ACL_GROUP) or (tag == _ACL_USER and uid != euid))


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def parse_host_port(value: str, field: str, *, listen: bool = False) -> tuple[str, int]:
    """"host:port" or "[v6]:port" -> (host, port). A listen address may have port 0: the
    kernel picks a free port, which the daemon reports (azprobe.daemon.address_file)."""
    host, sep, port = value.rpartition(":")
    if not sep or not is_decimal(port, 5) or not (0 if listen else 1) <= int(port) < 65536:
        raise ConfigError(field, f"{value!r} is not host:port", "for example 127.0.0.1:9740")
    return host.strip("[]") or "0.0.0.0", int(port)


def parse_topology(section: Section) -> dict[str, list[ipaddress.IPv4Network | ipaddress.IPv6Network]]:
    """[topology] AZ name -> list of CIDRs. Rejects bad CIDRs and prefixes shared by two AZs."""
    topology: dict[str, list[ipaddress.IPv4Network | ipaddress.IPv6Network]] = {}
    for az in section.data:
        problem = az_name_problem(az)
        if problem:  # the controller refuses every window that names such an AZ
            raise ConfigError(section.field(printable(az, 40)), f"AZ name {problem}", AZ_NAME_FIX)
        nets = []
        for cidr in section.string_list(az):
            try:
                nets.append(ipaddress.ip_network(cidr, strict=True))
            except ValueError as exc:
                raise ConfigError(section.field(az), f"bad CIDR {cidr!r}: {exc}") from None
        topology[az] = nets
    owners = [(net, az) for az, nets in topology.items() for net in nets]
    for i, (net, az) in enumerate(owners):
        for other_net, other_az in owners[i + 1:]:
            if az != other_az and net.version == other_net.version and net.overlaps(other_net):
                raise ConfigError(section.field(other_az), f"{other_net} overlaps {net} of {az}",
                                  "each address must belong to one AZ")
    return topology


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as a TOML value")


def _toml_key(key: str) -> str:
    return key if key.replace("-", "").replace("_", "").isalnum() else json.dumps(key)


def dump_toml(tables: Mapping[str, Mapping[str, Any]], header: str = "") -> str:
    """Write the configs azprobe generates (lab, demo, tests): tables of scalars and lists,
    nested tables as [a.b], in the given order. `header` becomes a leading comment."""
    lines = [f"# {line}" for line in header.splitlines()]

    def table(name: str, body: Mapping[str, Any]) -> None:
        lines.append(f"[{name}]")
        nested = []
        for key, value in body.items():
            if isinstance(value, Mapping):
                nested.append((f"{name}.{_toml_key(key)}", value))
            else:
                lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
        lines.append("")
        for sub_name, sub in nested:
            table(sub_name, sub)

    for name, body in tables.items():
        table(_toml_key(name), body)
    return "\n".join(lines)
