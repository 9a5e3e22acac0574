"""What SIGHUP re-reads: every live TLS context (tls.RotatingContext) and secret file
(secret_file.SecretFile) registers here, and a daemon's SIGHUP handler calls
`reload_all`, so rotated material is taken at once instead of at the next check of the
files. Held weakly: a client that is gone is not kept alive, nor reloaded.

`reload_on_sighup` is that handler for a command without an event loop (`azprobe
weights --watch`, `azprobe envoy-eds --watch`); a daemon on asyncio adds `on_sighup`
with `loop.add_signal_handler`."""

from __future__ import annotations

import logging
import signal
import threading
import weakref
from typing import Protocol

log = logging.getLogger(__name__)


class Reloadable(Protocol):
    def reload(self) -> bool: ...


_live: "weakref.WeakSet[Reloadable]" = weakref.WeakSet()
_lock = threading.Lock()


def register(item: Reloadable) -> None:
    with _lock:
        _live.add(item)


def reload_all() -> int:
    """Re-read every registered item now; the number whose new material is in use."""
    with _lock:
        items = list(_live)
    return sum(1 for item in items if item.reload())


def on_sighup() -> None:
    """SIGHUP for a process whose config is read at start only: every rotated file (TLS
    material, token and password files) is re-read now, and the count logged."""
    log.warning("SIGHUP: %d rotated file(s) taken", reload_all())


def reload_on_sighup() -> None:
    """Make SIGHUP re-read the rotated files instead of ending the process (its default
    action). Call from the main thread. The re-read runs on a thread of its own: a signal
    handler runs between two bytecodes of the main thread, which may hold the very lock
    a reload takes (a SecretFile's, a RotatingContext's)."""
    def handler(_signum: int, _frame: object) -> None:
        threading.Thread(target=on_sighup, name="sighup-reload", daemon=True).start()

    signal.signal(signal.SIGHUP, handler)
