"""The controller's garbage-collection schedule (docs/scale.md)."""

from __future__ import annotations

import gc
import time

FULL_GC_EVERY_S = 600.0
# Net tracked objects allocated since the last collection (gc.get_count()[0]: CPython
# counts allocations minus deallocations): 2.5x the store of 5,000 agents.
GC_GROWTH_LIMIT = 1_000_000


def pace_gc() -> None:
    """The window store holds ~15 Python objects per agent window for the whole evaluation
    window (~400,000 at 5,000 agents) and replaces a fifth of them every second. CPython's
    collector then scanned them over and over: full collections about once a second (40 %
    of the cycle's CPU), and even with rare full ones, young collections of the live
    windows cost ~9 µs per window. None of them form reference cycles (refcounting frees
    them), so the automatic collector is off; the startup objects are frozen out of every
    scan; and `FullCollections.collect_if_due` collects what cycles there are (asyncio,
    HTTP libraries) every FULL_GC_EVERY_S or after GC_GROWTH_LIMIT net new objects, a
    pause of ~0.4 s at 5,000 agents on a busy 2-core box (docs/scale.md)."""
    gc.freeze()
    gc.disable()


class FullCollections:
    """A full garbage collection at the end of a cycle (see pace_gc) every FULL_GC_EVERY_S,
    or sooner once GC_GROWTH_LIMIT more objects are alive than after the last one (a fleet
    of dead agents leaves ~10 objects of cyclic garbage per failed pull): a pause at a time
    that delays no pull, and memory stays bounded."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def collect_if_due(self) -> None:
        now = time.monotonic()
        if now - self.last >= FULL_GC_EVERY_S or gc.get_count()[0] > GC_GROWTH_LIMIT:
            gc.collect()
            self.last = now
