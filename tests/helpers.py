"""Shared test helpers. Tests synchronise by polling a condition with a deadline, never
by sleeping a fixed time (a loaded 2-core box makes fixed sleeps flaky)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02,
             message: str = "condition") -> T:
    """Call `predicate` until it returns something truthy; return that value.

    Raises AssertionError naming `message` (and the last exception the predicate raised,
    if any) when `timeout` seconds pass first.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
            last_exc = None
        except Exception as exc:  # the condition may not be checkable yet
            last_exc = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc!r})" if last_exc else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {message}{detail}")
        time.sleep(interval)


def sample_weights_doc(generation: int = 1, shares: dict[str, int] | None = None, *,
                       ttl_s: float = 60.0, now: float | None = None, source_az: str | None = None):
    """A valid weights document (azprobe.contracts.weights.WeightsDoc) for consumer tests."""
    from azprobe.contracts.weights import WeightsDoc, ZoneWeights

    shares = shares or {"az-a": 85, "az-b": 15}
    now = time.time() if now is None else now
    zones = {az: ZoneWeights(weight=1.0 if share >= 50 else 0.25, share=share, health=0.98 if share >= 50 else 0.3,
                             success=0.999, p95_ms=12.3, util=0.4, samples=1000,
                             state="ok" if share >= 50 else "degraded", reasons=(f"share {share}",))
             for az, share in shares.items()}
    return WeightsDoc(generation=generation, generated_at=now, expires_at=now + ttl_s, leader="ctl-test",
                      model="default", state="ok", zones=zones, source_az=source_az)
