"""A secret file (a token, a "user:password" line) re-read when it changes on disk or on
SIGHUP, so a rotated credential is sent from the next request on, without a restart.

`value()` compares the file's identity (inode, size, mtime) with the one last read on
every call - one stat - and re-reads on a change. A re-read that fails (the file
half-written, its mode loosened) keeps the last good value and is logged once per
change, without a byte of the file: a rotation in two steps never cuts the credential.
At start the first read is strict: its error is a ConfigError the daemon exits 2 on.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from azprobe.config import read_secret_file
from azprobe.errors import ConfigError
from azprobe.security import reloadable

T = TypeVar("T")
log = logging.getLogger(__name__)
MAX_BASIC_AUTH_BYTES = 1024


def _identity(path: str) -> tuple[int, int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0, 0)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class SecretFile(Generic[T]):
    """`read(path, field)` parses the file (e.g. config.read_token_file); its ConfigError
    names `field`."""

    def __init__(self, path: str, field: str, read: Callable[[str, str], T]) -> None:
        self.path = path
        self.field = field
        self._read = read
        self._lock = threading.Lock()
        self._seen = _identity(path)
        self._value = read(path, field)  # at start an error is fatal: raise it
        self.generation = 1
        reloadable.register(self)

    def __repr__(self) -> str:
        return f"SecretFile({self.path!r}, generation={self.generation})"  # never the value

    def value(self) -> T:
        if _identity(self.path) != self._seen:
            self.reload()
        return self._value

    def reload(self) -> bool:
        """Re-read now; True when the new content is in use."""
        with self._lock:
            seen = _identity(self.path)
            try:
                value = self._read(self.path, self.field)
            except ConfigError as exc:
                if seen != self._seen:
                    log.warning("%s: keeping the last good secret: %s", self.field, exc)
                self._seen = seen
                return False
            self._value, self._seen = value, seen
            self.generation += 1
            return True


_shared: dict[tuple[str, Callable[[str, str], Any]], "SecretFile[Any]"] = {}
_shared_lock = threading.Lock()


def shared(path: str, field: str, read: Callable[[str, str], T]) -> SecretFile[T]:
    """The process's one SecretFile for `path` read by `read` (made on first use, strictly):
    every client holding that credential sees one rotation at once, and a bad re-read is
    logged once, however many clients share the file. Kept for the process's life."""
    key = (os.path.abspath(path), read)
    with _shared_lock:
        secret = _shared.get(key)
        if secret is None:
            secret = _shared[key] = SecretFile(path, field, read)
        return secret


def read_basic_auth_file(path: str, field: str) -> tuple[str, str]:
    """("user", "password") from a secret file holding one line `user:password`."""
    raw = read_secret_file(path, field)
    text = raw.decode("utf-8", "replace").rstrip("\r\n")
    user, colon, password = text.partition(":")
    if (not colon or not user or len(raw) > MAX_BASIC_AUTH_BYTES
            or any(not c.isprintable() for c in text) or "\ufffd" in text):
        raise ConfigError(field, f"{path} must hold one line user:password of printable UTF-8 "
                          f"(up to {MAX_BASIC_AUTH_BYTES} bytes)",
                          "write one line user:password to it, mode 0600")
    return user, password
