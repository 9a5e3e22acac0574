"""Size limits of the shipped code: no function over 60 lines, no class over 250, in the
folders below (the dev tools, azprobe/dev/, are exempt). A part that outgrows them is
split by job, so a reader can see its parts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("agent", "controller", "azprobe")
EXEMPT = ("azprobe/dev/",)
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 250


def oversized(source: str, where: str) -> list[str]:
    """Every function and class of `source` over its limit, decorators included."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            lines = (node.end_lineno or node.lineno) - start + 1
            kind, limit = (("class", MAX_CLASS_LINES) if isinstance(node, ast.ClassDef)
                           else ("function", MAX_FUNCTION_LINES))
            if lines > limit:
                found.append(f"{where}:{node.lineno} {kind} {node.name} is {lines} lines (limit {limit})")
    return found


def _sources(folder: str) -> list[Path]:
    return [p for p in sorted((ROOT / folder).rglob("*.py"))
            if not p.relative_to(ROOT).as_posix().startswith(EXEMPT)]


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_function_or_class_over_its_limit(folder: str) -> None:
    sources = _sources(folder)
    assert sources, f"no Python sources under {folder}/"
    over = [line for path in sources for line in oversized(path.read_text(), path.relative_to(ROOT).as_posix())]
    assert not over, "split these by job:\n" + "\n".join(over)


def test_the_measure_counts_nested_functions_and_decorators() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 1))
    nested = "def outer():\n    @decorator\n    def inner():\n" + body.replace("    ", "        ") + "    return inner\n"
    assert oversized(nested, "m.py") == [
        f"m.py:1 function outer is {MAX_FUNCTION_LINES + 3} lines (limit {MAX_FUNCTION_LINES})",
        f"m.py:3 function inner is {MAX_FUNCTION_LINES + 1} lines (limit {MAX_FUNCTION_LINES})"]
    assert oversized("def f():\n" + body, "m.py") == []
