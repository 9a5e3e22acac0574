"""The two window sources meet behind one declared Protocol (controller/window_source.py):
each implements every member itself (no method borrowed from the other class), and no
code in controller/ asks which of the two it holds."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from azprobe.controller.collect import Collector
from azprobe.controller.prom_source import PrometheusCollector
from azprobe.controller.window_source import WindowSource
from tests.helpers import module_source

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (Collector, PrometheusCollector)


def _protocol_methods() -> set[str]:
    return {name for name, value in vars(WindowSource).items()
            if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))}


def _own_methods(cls: type) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """The methods written in `cls`'s own body, read from its source (a compiled class's
    methods are not Python functions to inspect)."""
    tree = ast.parse(module_source(cls.__module__).read_text())
    (body,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == cls.__name__]
    return {node.name: node for node in body.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_each_source_implements_every_protocol_method_itself():
    methods = _protocol_methods()
    assert {"set_targets", "pull_all", "take_new", "agent_states", "close", "cursors"} <= methods
    for cls in SOURCES:
        own = _own_methods(cls)
        for name in methods - {"cursors"}:  # cursors: an attribute of each instance
            assert name in own, f"{cls.__name__}.{name} is not its own method"
            assert getattr(cls, name) is vars(cls)[name], f"{cls.__name__}.{name} is borrowed"


def test_the_protocol_attributes_are_set_by_each_source():
    annotated = set(WindowSource.__annotations__) | {"cursors"}
    for cls in SOURCES:
        init = ast.unparse(_own_methods(cls)["__init__"])
        for name in annotated:
            assert re.search(rf"self\.{name}\b[^=\n]*=", init), f"{cls.__name__} does not set {name}"


def test_no_code_in_controller_asks_which_source_it_holds():
    pattern = re.compile(r"isinstance\([^)]*\b(Collector|PrometheusCollector)\b|=\s*(Collector|PrometheusCollector)\.\w+\s*$",
                         re.M)
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in sorted((ROOT / "controller").glob("*.py"))
             for m in pattern.finditer(p.read_text())]
    assert not found, found
