"""Cycles run on a fixed grid of window time: an overrun skips the ticks it missed
instead of starting the next cycle at once (docs/scale.md, "Scheduling")."""

from __future__ import annotations

import pytest

from azprobe.controller.main import next_tick


@pytest.mark.parametrize("previous, now, expected", [
    (10.0, 10.2, 11.0),  # on time: the next tick
    (10.0, 11.0, 11.0),  # exactly at the next tick: run it
    (10.0, 11.3, 12.0),  # overran by 0.3 s: tick 11 is skipped, not run late
    (10.0, 13.9, 14.0),  # overran by several ticks: still one cycle, on the grid
])
def test_next_tick_stays_on_the_grid(previous, now, expected):
    assert next_tick(previous, now, 1.0) == pytest.approx(expected)


def test_an_overrun_never_schedules_cycles_back_to_back():
    start, ticks, now = 0.0, [], 0.0
    for duration in (0.4, 2.5, 0.4, 1.7, 0.1):  # two cycles over budget
        now += duration
        start = next_tick(start, now, 1.0)
        ticks.append(start)
        now = start
    assert all(b - a >= 1.0 for a, b in zip(ticks, ticks[1:]))
    assert all(t == int(t) for t in ticks)  # every start on the 1 s grid


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
