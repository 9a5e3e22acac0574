"""The agent's ring of probe events (failed connects, resets): what /v1/events serves and
the per-kind counts /metrics exports."""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable

from azprobe.agent.probe import ProbeEvent

log = logging.getLogger("azprobe.agent")

EVENT_RING_SIZE = 1000


class EventLog:
    """Written by the agent's loop thread; read by the HTTP server (a copy of the ring)."""

    def __init__(self, size: int = EVENT_RING_SIZE) -> None:
        self._events: deque[dict] = deque(maxlen=size)
        self._last_id = 0
        self._totals: Counter = Counter()
        self._interval: Counter = Counter()  # since the last window, for one log line per window

    def record(self, event: ProbeEvent, name_of_az: Callable[[int], str]) -> None:
        wall = time.time() - (time.monotonic_ns() - event.ts_ns) / 1e9
        self._last_id += 1
        self._events.append({
            "id": self._last_id, "ts": round(wall, 6), "kind": event.kind,
            "src": name_of_az(event.src_az_id), "dst": name_of_az(event.dst_az_id),
            "saddr": event.saddr, "sport": event.sport, "daddr": event.daddr, "dport": event.dport,
        })
        self._totals[event.kind] += 1
        self._interval[event.kind] += 1
        log.debug("event %s", self._events[-1])

    def after(self, after: int) -> list[dict]:
        """The events with an id above `after`, oldest first."""
        return [e for e in list(self._events) if e["id"] > after]

    def totals(self) -> dict[str, int]:
        """Events per kind since start."""
        return dict(self._totals)

    def log_interval(self, seq: int) -> None:
        """One log line for the events since the previous window, if any."""
        if self._interval:
            log.info("events seq %d: %s", seq, " ".join(f"{k}={n}" for k, n in sorted(self._interval.items())))
            self._interval.clear()
