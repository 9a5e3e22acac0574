"""The controller's per-cycle path runs compiled (setup.py, pyproject.toml [tool.azprobe]
compiled): every listed file is a module of the tree, and in a compiled install each one
is an extension built from the source as it is now, not an older one."""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import os
import tomllib
from pathlib import Path

import pytest

from tests.helpers import module_source

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
COMPILED = PYPROJECT["tool"]["azprobe"]["compiled"]
FOLDERS = {folder: package for package, folder in PYPROJECT["tool"]["setuptools"]["package-dir"].items()}


def module_name(path: str) -> str:
    """controller/quorum.py -> azprobe.controller.quorum (pyproject.toml's package-dir)."""
    folder, _, rest = path.removesuffix(".py").partition("/")
    return f"{FOLDERS[folder]}.{rest.replace('/', '.')}"


def test_every_compiled_file_is_a_module_of_the_tree_listed_once():
    assert len(set(COMPILED)) == len(COMPILED)
    for path in COMPILED:
        assert module_source(module_name(path)) == ROOT / path, path


@pytest.mark.skipif(os.environ.get("AZPROBE_COMPILE") == "0", reason="AZPROBE_COMPILE=0: installed as plain Python")
@pytest.mark.parametrize("path", COMPILED)
def test_the_module_runs_compiled_from_its_current_source(path):
    name = module_name(path)
    # What the import system loads, asked of the folder (a compiled module imported by
    # another one carries a made-up __file__ and __spec__).
    package = importlib.import_module(name.rpartition(".")[0])
    spec = importlib.machinery.PathFinder.find_spec(name, list(package.__path__))
    built = Path(spec.origin if spec is not None and spec.origin else "")
    assert built.suffix == ".so", (f"{name} runs as plain Python ({built}): rebuild with `make setup` "
                                   "(AZPROBE_COMPILE=0 in the environment skips this)")
    if built.is_relative_to(ROOT):  # an editable install: the extension lies next to its source
        assert built.stat().st_mtime >= (ROOT / path).stat().st_mtime, \
            f"{built.name} is older than {path}: the tests would run the old code; rebuild with `make setup`"


def test_no_compiled_function_binds_one_except_name_to_two_types():
    """mypyc types the name of an `except ... as name` by the first clause that binds it:
    a later clause of another type then fails with a TypeError instead of running (a
    refused pull of a compiled collector was counted nowhere). One name per type."""
    twice = []
    for path in COMPILED:
        for function in ast.walk(ast.parse((ROOT / path).read_text())):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            caught: dict[str, set[str]] = {}
            for node in ast.walk(function):
                if isinstance(node, ast.ExceptHandler) and node.name:
                    caught.setdefault(node.name, set()).add(ast.unparse(node.type) if node.type else "")
            twice += [f"{path}:{function.lineno} {function.name}: {name} catches {sorted(types)}"
                      for name, types in caught.items() if len(types) > 1]
    assert not twice, twice
