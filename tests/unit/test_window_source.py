"""The two window sources meet behind one declared Protocol (controller/window_source.py):
each implements every member itself (no method borrowed from the other class), and no
code in controller/ asks which of the two it holds."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from azprobe.controller.collect import Collector
from azprobe.controller.prom_source import PrometheusCollector
from azprobe.controller.window_source import WindowSource

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (Collector, PrometheusCollector)


def _protocol_methods() -> set[str]:
    return {name for name, value in vars(WindowSource).items()
            if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))}


def test_each_source_implements_every_protocol_method_itself():
    methods = _protocol_methods()
    assert {"set_targets", "pull_all", "take_new", "agent_states", "close", "cursors"} <= methods
    for cls in SOURCES:
        for name in methods - {"cursors"}:  # cursors: an attribute of each instance
            own = vars(cls).get(name)
            assert own is not None and inspect.isfunction(own), f"{cls.__name__}.{name} is not its own method"
            assert own.__qualname__ == f"{cls.__name__}.{name}", \
                f"{cls.__name__}.{name} is borrowed: it is {own.__qualname__}"


def test_the_protocol_attributes_are_set_by_each_source():
    annotated = set(WindowSource.__annotations__) | {"cursors"}
    for cls in SOURCES:
        init = inspect.getsource(cls.__init__)
        for name in annotated:
            assert re.search(rf"self\.{name}\b[^=\n]*=", init), f"{cls.__name__} does not set {name}"


def test_no_code_in_controller_asks_which_source_it_holds():
    pattern = re.compile(r"isinstance\([^)]*\b(Collector|PrometheusCollector)\b|=\s*(Collector|PrometheusCollector)\.\w+\s*$",
                         re.M)
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in sorted((ROOT / "controller").glob("*.py"))
             for m in pattern.finditer(p.read_text())]
    assert not found, found
