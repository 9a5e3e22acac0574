"""`--address-file PATH`: a daemon says where it really listens.

Every azprobe server (agent, controller, devconsul) accepts listen port 0, and with
--address-file writes the address it bound, "host:port\\n", once it is serving. A test or
the demo starts a child on port 0 and reads this file: no "find a free port, release it,
hope nobody takes it before the child binds" race. The write is atomic (a temporary file
renamed over PATH), so a reader never sees half a line.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

from azprobe.config import parse_host_port
from azprobe.errors import ConfigError


def format_host_port(host: str, port: int) -> str:
    """host:port, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def write_address_file(path: str | Path, host: str, port: int) -> None:
    """Raises ConfigError("--address-file", ...) when PATH cannot be written: every daemon
    turns it into one line and exit 2, as for any other bad flag."""
    target = Path(path)
    directory = target.parent
    if not directory.is_dir():
        problem = "is not a directory" if directory.exists() else "does not exist"
        raise ConfigError("--address-file", f"directory {str(directory)!r} {problem}",
                          "create it, or pass a path in an existing directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError("--address-file", f"directory {str(directory)!r} is not writable by this user",
                          "pass a path in a directory this user may write")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(format_host_port(host, port) + "\n")
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise ConfigError("--address-file", f"cannot write {str(target)!r}: {exc.strerror or exc}",
                          "pass a path this user may write, not a directory") from None


def read_address_file(path: str | Path) -> tuple[str, int] | None:
    """(host, port) from a daemon's address file; None while it is not written yet."""
    try:
        text = Path(path).read_text().strip()
    except FileNotFoundError:
        return None
    return parse_host_port(text, str(path)) if text else None


def wait_for_address_file(path: str | Path, *, alive: Callable[[], bool], timeout_s: float,
                          poll_s: float = 0.02) -> tuple[str, int] | None:
    """Poll for a child's address file; None when the child dies or timeout_s passes first
    (the caller raises with the child's log)."""
    deadline = time.monotonic() + timeout_s
    while True:
        address = read_address_file(path)
        if address is not None:
            return address
        if not alive() or time.monotonic() >= deadline:
            return None
        time.sleep(poll_s)
