"""A round starts interval_s after the previous start; after an overrun, a short rest after
it ends, never back to back and never a whole tick late (docs/scale.md, "Scheduling")."""

from __future__ import annotations

import math

import pytest

from azprobe.controller.main import OVERRUN_REST, next_start


@pytest.mark.parametrize("previous, now, expected", [
    (10.0, 10.2, 11.0),  # on time: one interval after the previous start
    (10.0, 11.0, 11.1),  # ended exactly at the next start: the rest first
    (10.0, 11.3, 11.4),  # overran by 0.3 s: the rest, not the 12.0 tick
    (10.0, 13.9, 14.0),  # overran by several intervals: still one round, after the rest
])
def test_next_start_follows_the_previous_round(previous, now, expected):
    assert next_start(previous, now, 1.0) == pytest.approx(expected)


def _rounds(schedule, count: int = 12, slow: int = 2) -> tuple[list[float], list[float]]:
    """Round durations, and the rests after them, when a round costs 0.3 s plus 0.5 s per
    second of windows since the previous pull (windows arrive at a steady rate), and
    round `slow` pauses 0.6 s more."""
    start, previous_pull, durations, rests = 0.0, -1.0, [], []
    for i in range(count):
        duration = 0.3 + 0.5 * (start - previous_pull) + (0.6 if i == slow else 0.0)
        previous_pull = start
        durations.append(duration)
        end = start + duration
        start = schedule(start, end, 1.0)
        rests.append(start - end)
    return durations, rests


def test_one_slow_round_does_not_leave_every_later_round_over_budget():
    def next_grid_tick(previous: float, now: float, interval: float) -> float:
        return previous + interval * max(1, math.ceil((now - previous) / interval + 1e-9))

    grid, _ = _rounds(next_grid_tick)
    assert min(grid[5:]) > 1.0  # waiting for the next tick: twice the windows, for good
    durations, rests = _rounds(next_start)
    assert max(durations[5:]) < 1.0, durations  # back under budget within a few rounds
    assert min(rests) >= OVERRUN_REST * 1.0 - 1e-9  # and never back to back


def test_full_collections_by_time_or_by_growth(monkeypatch):
    """pace_gc turns the automatic collector off; the controller collects at the end of a
    cycle every FULL_GC_EVERY_S, or sooner once GC_GROWTH_LIMIT more objects are alive."""
    import gc

    from azprobe.controller import gcpace, main
    from azprobe.controller.config import parse_config

    controller = main.Controller(parse_config({
        "controller": {"name": "c", "listen": "127.0.0.1:9741"}, "consul": {"address": "http://127.0.0.1:1"},
        "agents": {"static": ["http://127.0.0.1:9740"]}, "topology": {"azs": ["az-a"]}}))
    collections: list[int] = []
    alive = [10]
    monkeypatch.setattr(gc, "collect", lambda *args: collections.append(1) or 0)
    monkeypatch.setattr(gc, "get_count", lambda: (alive[0], 0, 0))
    controller.decider.gc.collect_if_due()
    assert collections == []  # just started, little growth
    alive[0] = gcpace.GC_GROWTH_LIMIT + 1
    controller.decider.gc.collect_if_due()
    assert collections == [1]
    alive[0] = 10
    controller.decider.gc.last -= gcpace.FULL_GC_EVERY_S
    controller.decider.gc.collect_if_due()
    assert collections == [1, 1]
