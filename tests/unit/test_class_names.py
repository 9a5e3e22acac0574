"""One name, one thing: a class name is defined once across the package's folders (private
`_Name` counts as `Name`), so a reader who meets `AgentState` knows which one it is.

The names below are defined twice on purpose: each time the same thing seen from the
other side, in modules that never meet (neither imports the other)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("agent", "controller", "azprobe", "bpf")
SAME_THING_TWICE = {
    # An HTTP response: the agent's server sends one (agent/httpserver/wire.py), the
    # HTTP client receives one (azprobe/clients/transport.py).
    "Response": 2,
    # A TCP connection: the agent's server's end (agent/httpserver/connections.py), the
    # HTTP client's end (azprobe/clients/transport.py).
    "Connection": 2,
}


def class_definitions(folders: tuple[str, ...] = FOLDERS) -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    found[node.name.lstrip("_")].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_class_name_means_one_thing() -> None:
    twice = {name: where for name, where in class_definitions().items()
             if len(where) > 1 and len(where) != SAME_THING_TWICE.get(name)}
    assert not twice, f"one class name, several classes (rename one, or list it above with why): {twice}"


def test_the_list_of_kept_names_is_current() -> None:
    defined = class_definitions()
    stale = {name: defined.get(name, []) for name, n in SAME_THING_TWICE.items() if len(defined.get(name, [])) != n}
    assert not stale, f"no longer defined that often: drop or fix them in SAME_THING_TWICE: {stale}"


def test_no_test_helper_borrows_a_class_name_of_the_package() -> None:
    """A fake or driver in tests/ or bench/ named like a class of the package reads as
    that class in a traceback or a grep."""
    shipped = class_definitions()
    borrowed = {name: where for name, where in class_definitions(("tests", "bench")).items() if name in shipped}
    assert not borrowed, f"test helpers named like a class of the package (rename them): {borrowed}"
