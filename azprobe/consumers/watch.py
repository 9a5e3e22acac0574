"""WeightWatcher: the consumer library for schedulers and sidecars.

    with WeightWatcher(ConsulSettings.from_env()) as watcher:
        doc = watcher.snapshot()      # WeightsDoc while fresh, else None
        if doc is None:
            ...                       # no usable weights: spread evenly

A background thread runs a blocking watch on `<prefix>weights` (or any key under the
prefix, e.g. "weights/from/az-a"). Each valid document replaces the snapshot in one
reference swap; readers never see a half-updated document, and documents are immutable.

Staleness (decided here, relied on by envoy-eds): `snapshot()` returns None once the
document's `expires_at` has passed, so a scheduler that only calls `snapshot()` cannot
act on stale weights by accident; None means "no usable weights, use your default
(equal spread)". `last_known_good()` still returns the expired document and `status()`
tells "fresh" / "stale" / "empty" apart, for display and diagnosis.

Until then, errors never clear the snapshot: Consul down, a 403, a deleted key or a
rejected document all keep the last-known-good document (the incident this project
exists for was a reader that turned missing data into "every zone is down").

`parse=parse_hosts` watches the sick-hosts document (azprobe.contracts.weights_hosts)
the same way: it is ordered, aged and refused from the future by the same rules.

Which document wins is the contract's `is_newer` (azprobe/contracts/weights.py): by
generation within one leader term, by generated_at across terms. A document dated more
than MAX_CLOCK_SKEW_S ahead of this watcher's clock is rejected (counted, one log line),
so a future-dated document can neither be taken nor make later ones look older.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from azprobe.clients.consul import ConsulError, ConsulSettings, KeyState, KeyWatch, make_client
from azprobe.contracts import kv
from azprobe.contracts.weights import WeightsDoc, WeightsError, is_newer, parse_weights

log = logging.getLogger(__name__)

FRESH, STALE, EMPTY = "fresh", "stale", "empty"


@dataclass(frozen=True)
class WatcherStatus:
    state: str  # fresh | stale | empty (never had a valid document)
    doc: WeightsDoc | None  # last known good, even when stale
    key: str
    key_absent: bool  # Consul's last successful answer: the key does not exist
    errors: int  # failed Consul calls
    rejected: int  # documents that failed validation or were dated in the future
    ignored_older: int  # valid documents not newer than the one held (contracts' is_newer)
    callback_errors: int
    last_error: str | None
    last_success_at: float | None  # unix time of the last successful Consul read


class WeightWatcher:
    """Watch one weights key; see the module doc for the staleness contract.

    `on_change(doc)` runs on the watcher thread after each new valid document; an
    exception in it is logged and counted, never kills the watch.
    """

    def __init__(self, settings: ConsulSettings, key: str = kv.WEIGHTS,
                 on_change: Callable[[WeightsDoc], None] | None = None, *,
                 wait_s: float = 30.0, min_interval_s: float = 0.1,
                 backoff_base_s: float = 0.2, backoff_cap_s: float = 5.0,
                 clock: Callable[[], float] = time.time,
                 parse: Callable[..., WeightsDoc] = parse_weights, absent_is_normal: bool = False) -> None:
        self.settings = settings
        self._parse = parse
        # the sick-hosts key is absent while no host is named: no warning for that
        self._absent_log = log.debug if absent_is_normal else log.warning
        self.key = settings.key(key)
        self.on_change = on_change
        self._clock = clock
        self._watch = KeyWatch(make_client(settings), self.key, wait_s=wait_s,
                               min_interval_s=min_interval_s, backoff_base_s=backoff_base_s,
                               backoff_cap_s=backoff_cap_s)
        self._lock = threading.Lock()  # guards the counters; the doc is swapped by reference
        self._doc: WeightsDoc | None = None
        self._absent = False
        self._rejected = 0
        self._ignored_older = 0
        self._callback_errors = 0
        self._last_error: str | None = None
        self._last_success_at: float | None = None
        self._answered = threading.Event()  # Consul answered at least once
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- reading ---

    def snapshot(self, now: float | None = None) -> WeightsDoc | None:
        """The current document while fresh; None when stale or never received."""
        doc = self._doc
        if doc is None or doc.is_stale(self._clock() if now is None else now):
            return None
        return doc

    def last_known_good(self) -> WeightsDoc | None:
        """The last valid document, even if expired (display only: do not route on it)."""
        return self._doc

    def status(self, now: float | None = None) -> WatcherStatus:
        doc = self._doc
        if doc is None:
            state = EMPTY
        else:
            state = STALE if doc.is_stale(self._clock() if now is None else now) else FRESH
        with self._lock:
            return WatcherStatus(state=state, doc=doc, key=self.key, key_absent=self._absent,
                                 errors=self._watch.errors, rejected=self._rejected,
                                 ignored_older=self._ignored_older, callback_errors=self._callback_errors,
                                 last_error=self._last_error, last_success_at=self._last_success_at)

    @property
    def errors(self) -> int:
        return self._watch.errors

    @property
    def rejected(self) -> int:
        with self._lock:
            return self._rejected

    def wait_answered(self, timeout: float) -> bool:
        """Block until Consul has answered once (document, absent key or bad document)."""
        return self._answered.wait(timeout)

    # --- lifecycle ---

    def start(self) -> "WeightWatcher":
        if self._thread is not None:
            raise RuntimeError("WeightWatcher already started")
        self._thread = threading.Thread(target=self._run, name=f"weight-watcher:{self.key}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 1.0) -> None:
        """Stop watching: no new callback starts once this is called. A blocking read in
        flight is not interrupted; the daemon thread ends when it returns (<= wait_s)."""
        self._stop.set()
        with self._lock:
            self.on_change = None
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def __enter__(self) -> "WeightWatcher":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the watch thread ---

    def _run(self) -> None:
        self._watch.run(self._on_state, self._stop, self._on_error)

    def _on_error(self, exc: ConsulError) -> None:
        with self._lock:
            self._last_error = str(exc)
        log.warning("weights watch %s: %s (keeping last-known-good)", self.key, exc)

    def _on_state(self, state: KeyState) -> None:
        with self._lock:
            self._last_success_at = self._clock()
            self._absent = state.value is None
        self._answered.set()
        if state.value is None:
            with self._lock:
                self._last_error = f"key {self.key} does not exist"
            self._absent_log("weights key %s is absent (keeping last-known-good)", self.key)
            return
        now = self._clock()
        try:
            doc = self._parse(state.value, now=now)
        except WeightsError as exc:
            with self._lock:
                self._rejected += 1
                self._last_error = f"rejected document at {self.key}: {exc}"
            log.warning("rejected weights document at %s: %s (keeping last-known-good)", self.key, exc)
            return
        held = self._doc
        if not is_newer(doc, held, now):
            if held is not None and doc != held:
                with self._lock:
                    self._ignored_older += 1
                log.warning("ignoring weights generation %d (term %s) at %s: not newer than generation %d (term %s)",
                            doc.generation, doc.term or "-", self.key, held.generation, held.term or "-")
            return
        self._doc = doc  # the atomic swap
        with self._lock:
            self._last_error = None
            callback = self.on_change
        if callback is not None and not self._stop.is_set():
            try:
                callback(doc)
            except Exception:
                with self._lock:
                    self._callback_errors += 1
                log.exception("weights on_change callback failed")
