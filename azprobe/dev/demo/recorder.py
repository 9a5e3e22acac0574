"""Records every generation of `<prefix>weights` with a blocking watch, in a thread."""

from __future__ import annotations

import logging
import threading
import time
from typing import Self

from azprobe.clients.consul import ConsulError, ConsulSettings, KeyState, KeyWatch, make_client
from azprobe.dev.demo.metrics import KvSample
from azprobe.contracts import bounded_json, kv
from azprobe.contracts.weights import WeightsDoc, WeightsError, parse_weights
from azprobe.contracts.weights_hosts import parse_hosts

log = logging.getLogger(__name__)


class _KeyRecorder:
    """A background thread recording one key under the prefix; start() / stop()."""

    def __init__(self, consul_url: str, prefix: str, name: str) -> None:
        self.settings = ConsulSettings(address=consul_url, prefix=prefix)
        self.key = self.settings.key(name)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"recorder {self.key}", daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        raise NotImplementedError


class KvRecorder(_KeyRecorder):
    """A timeline of (monotonic time, weights document). `latest` is the newest pair."""

    def __init__(self, consul_url: str, prefix: str) -> None:
        super().__init__(consul_url, prefix, kv.WEIGHTS)
        # A short wait so stop() returns quickly; a change still returns at once.
        self._watch = KeyWatch(make_client(self.settings), self.key, wait_s=2.0, min_interval_s=0.0)
        self._samples: list[KvSample] = []
        self._latest: WeightsDoc | None = None
        self.rejected = 0
        self.errors = 0

    def _run(self) -> None:
        self._watch.run(self._on_change, self._stop, self._on_error)

    def _on_error(self, exc: ConsulError) -> None:
        self.errors += 1
        log.debug("kv recorder: %s", exc)

    def _on_change(self, state: KeyState) -> None:
        now = time.monotonic()
        if state.value is None:
            return  # not written yet
        try:
            doc = parse_weights(state.value)
        except WeightsError as exc:
            self.rejected += 1
            log.warning("kv recorder: rejected weights document: %s", exc)
            return
        with self._lock:
            self._samples.append(KvSample.from_doc(now, doc))
            self._latest = doc

    @property
    def samples(self) -> list[KvSample]:
        with self._lock:
            return list(self._samples)

    @property
    def latest(self) -> WeightsDoc | None:
        with self._lock:
            return self._latest


class HostsRecorder(_KeyRecorder):
    """A timeline of (monotonic time, zone -> the addresses the sick-hosts document names
    in its global view, worst first): every generation of `<prefix>hosts`."""

    def __init__(self, consul_url: str, prefix: str) -> None:
        super().__init__(consul_url, prefix, kv.HOSTS)
        self._watch = KeyWatch(make_client(self.settings), self.key, wait_s=2.0, min_interval_s=0.0)
        self._samples: list[tuple[float, dict[str, list[str]]]] = []

    def _run(self) -> None:
        self._watch.run(self._on_change, self._stop, lambda exc: log.debug("hosts recorder: %s", exc))

    def _on_change(self, state: KeyState) -> None:
        now = time.monotonic()
        if state.value is None:
            return
        try:
            doc = parse_hosts(state.value)
        except WeightsError as exc:
            log.warning("hosts recorder: rejected sick-hosts document: %s", exc)
            return
        with self._lock:
            self._samples.append((now, {az: [h.addr for h in hosts] for az, hosts in doc.sick().items()}))

    @property
    def samples(self) -> list[tuple[float, dict[str, list[str]]]]:
        with self._lock:
            return list(self._samples)

    def first_naming(self, addr: str, since: float) -> float | None:
        """When the document first named `addr` at or after `since` (None: never)."""
        return next((t for t, zones in self.samples if t >= since and any(addr in a for a in zones.values())), None)


class LeaderRecorder(_KeyRecorder):
    """Records who holds `<prefix>leader` over time: (monotonic t, holder name or None).

    A blocking read on the key returns on every ModifyIndex change, including the
    release when a killed leader's session expires (value unchanged, Session cleared),
    which a value-comparing watch would not report. That release is what a standby waits
    for, so the failover figures are measured from it.
    """

    def __init__(self, consul_url: str, prefix: str) -> None:
        super().__init__(consul_url, prefix, kv.LEADER)
        self._client = make_client(self.settings)
        self._events: list[tuple[float, str | None]] = []

    def _run(self) -> None:
        index: int | None = None
        while not self._stop.is_set():
            try:
                new_index, data = self._client.kv.get(self.key, index=index, wait="2s")
            except Exception as exc:  # any failure: back off briefly and read afresh
                log.debug("leader recorder: %s", exc)
                index = None
                self._stop.wait(0.2)
                continue
            holder = holder_of(data)
            with self._lock:
                if not self._events or self._events[-1][1] != holder:
                    self._events.append((time.monotonic(), holder))
            index = int(new_index) if new_index and (index is None or int(new_index) >= index) else None

    @property
    def events(self) -> list[tuple[float, str | None]]:
        with self._lock:
            return list(self._events)


def holder_of(entry: dict | None) -> str | None:
    """The name of the controller holding the lock, None when nobody does."""
    if not entry or not entry.get("Session"):
        return None
    try:
        value = bounded_json.loads(entry.get("Value") or b"{}", max_bytes=kv.MAX_VALUE_BYTES, what="leader key")
    except bounded_json.JsonRefused:
        return "?"
    return str(value.get("name", "?")) if isinstance(value, dict) else "?"
