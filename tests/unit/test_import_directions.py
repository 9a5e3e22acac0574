"""Import directions of the azprobe package, read statically (ast) from every module.

The layers are the table under "### Layers" in docs/design.md, read from there: the doc
states the rules and this test enforces exactly what it states. A module imports its own
group and the groups of lower layers only. Every import statement counts, also one inside
a function (a lazy import is still a dependency) or under `if TYPE_CHECKING:`. A module
in no layer fails, and so does a name in the table that no module of the tree has.
"""

from __future__ import annotations

import ast
import functools
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DESIGN_DOC = ROOT / "docs" / "design.md"
LAYERS_HEADING = "### Layers"

Layers = dict[tuple[int, str], tuple[str, ...]]  # (layer, group) -> module-name prefixes


class LayerTableError(ValueError):
    pass


def parse_layers(doc: str) -> Layers:
    """The first table after LAYERS_HEADING: | layer | group | modules |, the modules as
    backquoted `azprobe...` names (other text in the cell is commentary)."""
    _, found, rest = doc.partition("\n" + LAYERS_HEADING + "\n")
    if not found:
        raise LayerTableError(f"no {LAYERS_HEADING!r} heading")
    rows = []
    for line in rest.splitlines():
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break  # the table ended
    if len(rows) < 3 or [c.lower() for c in rows[0]] != ["layer", "group", "modules"]:
        raise LayerTableError(f"under {LAYERS_HEADING!r}: expected a table | layer | group | modules |")
    layers: Layers = {}
    owner: dict[str, str] = {}
    for cells in rows[2:]:
        if len(cells) != 3 or not cells[0].isdigit() or not re.fullmatch(r"[a-z]+", cells[1]):
            raise LayerTableError(f"bad layer row {' | '.join(cells)!r}: expected | <int> | <group> | `module`, ... |")
        layer, group = int(cells[0]), cells[1]
        prefixes = tuple(re.findall(r"`(azprobe(?:\.[a-z_][a-z0-9_]*)*)`", cells[2]))
        if not prefixes:
            raise LayerTableError(f"layer row {group!r} names no `azprobe...` module")
        if any(g == group for _, g in layers):
            raise LayerTableError(f"group {group!r} has two rows")
        for prefix in prefixes:
            if prefix in owner:
                raise LayerTableError(f"{prefix} is in two groups: {owner[prefix]} and {group}")
            owner[prefix] = group
        layers[(layer, group)] = prefixes
    return layers


@functools.cache
def doc_layers() -> Layers:
    """The layers docs/design.md states."""
    try:
        return parse_layers(DESIGN_DOC.read_text())
    except LayerTableError as exc:
        raise AssertionError(f"docs/design.md: {exc}") from None


def _package_dirs() -> dict[str, str]:
    """Source folder -> the package it is installed as (pyproject.toml's package-dir)."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {folder: package for package, folder in mapping.items()}


PACKAGE_DIRS = _package_dirs()
# The mapped folders' own names: importing them is a bug (they are not installed).
OLD_TOP_LEVEL = tuple(folder for folder in PACKAGE_DIRS if folder != "azprobe")


@dataclass(frozen=True)
class Module:
    name: str
    source: str
    is_package: bool = False  # an __init__.py: relative imports resolve from the module itself


@dataclass(frozen=True)
class Violation:
    module: str
    line: int
    imported: str
    rule: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line} imports {self.imported}: {self.rule}"


def group_of(name: str, layers: Layers | None = None) -> tuple[int, str] | None:
    """(layer, group) of a module name, by its longest matching prefix; None if unplaced.
    "azprobe" is the package's __init__ only (azprobe.newthing is in no layer)."""
    best: tuple[int, tuple[int, str]] | None = None
    for key, prefixes in (doc_layers() if layers is None else layers).items():
        for prefix in prefixes:
            covers = name == prefix or (prefix != "azprobe" and name.startswith(prefix + "."))
            if covers and (best is None or len(prefix) > best[0]):
                best = (len(prefix), key)
    return best[1] if best else None


def imported_names(module: Module, known: set[str]) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import statement anywhere in the module.
    `from pkg import name` counts as pkg.name when that is a module of the package."""
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    for node in ast.walk(ast.parse(module.source, filename=module.name)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[:len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                yield node.lineno, candidate if candidate in known else base


def check_imports(modules: Mapping[str, Module]) -> list[Violation]:
    """Every import that breaks the layering of docs/design.md (pure: module name -> source)."""
    known = set(modules)
    violations: list[Violation] = []
    for module in modules.values():
        here = group_of(module.name)
        if here is None:
            violations.append(Violation(module.name, 0, "-", "module is in no layer: name it (or a package "
                                        "above it) in the layer table of docs/design.md"))
            continue
        for line, name in imported_names(module, known):
            top = name.split(".")[0]
            if top in OLD_TOP_LEVEL:
                violations.append(Violation(module.name, line, name, f"'{top}' is not a package any more; "
                                            f"import azprobe.{name}"))
                continue
            if top != "azprobe":
                continue
            there = group_of(name)
            if there is None or there == here:
                continue
            if there[0] >= here[0]:
                violations.append(Violation(module.name, line, name,
                                            f"{here[1]} (layer {here[0]}) may not import {there[1]} "
                                            f"(layer {there[0]}): imports go to a lower layer only"))
    return sorted(violations, key=lambda v: (v.module, v.line, v.imported))


def package_modules(root: Path = ROOT) -> dict[str, Module]:
    """Every module of the installed package, named as installed, read from the source tree."""
    modules: dict[str, Module] = {}
    mapped = {folder for folder in PACKAGE_DIRS if folder != "azprobe"}
    for folder, package in PACKAGE_DIRS.items():
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root / folder)
            if folder == "azprobe" and rel.parts[0] in mapped:
                continue  # a stray azprobe/agent/... would shadow nothing; the mapped folder wins
            parts = [p for p in rel.with_suffix("").parts if p != "__init__"]
            name = ".".join([package, *parts])
            modules[name] = Module(name, path.read_text(), is_package=path.name == "__init__.py")
    return modules


# --- the tree ------------------------------------------------------------------------------

def test_the_package_imports_only_downward() -> None:
    violations = check_imports(package_modules())
    assert not violations, "import direction violations:\n" + "\n".join(map(str, violations))


def test_the_walk_reads_the_whole_package() -> None:
    """The check cannot pass by reading nothing: the mapped folders are found under their
    installed names, and lazy imports inside functions are seen."""
    modules = package_modules()
    for name in ("azprobe.contracts.window", "azprobe.agent.main", "azprobe.controller.main", "azprobe.bpf",
                 "azprobe.consumers.watch", "azprobe.commands.doctor", "azprobe.commands.cli", "azprobe.dev.devconsul.http"):
        assert name in modules, name
    assert not any(name.startswith(("agent", "controller", "bpf")) for name in modules)
    doctor_imports = {name for _, name in imported_names(modules["azprobe.commands.doctor"], set(modules))}
    assert "azprobe.controller.config" in doctor_imports  # a function-level import in the doctor


# --- the doc's table is the rule set ---------------------------------------------------------

def test_every_name_in_the_doc_is_a_module_of_the_tree() -> None:
    """A row naming a module that no longer exists is a stale doc, not a rule."""
    modules = set(package_modules())
    stale = [prefix for prefixes in doc_layers().values() for prefix in prefixes
             if not any(name == prefix or name.startswith(prefix + ".") for name in modules)]
    assert not stale, f"docs/design.md's layer table names modules the tree does not have: {stale}"


def test_every_module_of_the_tree_is_in_a_layer_of_the_doc() -> None:
    unplaced = sorted(name for name in package_modules() if group_of(name) is None)
    assert not unplaced, f"in no layer of docs/design.md: {unplaced}"


def test_the_doc_keeps_the_stack_whole() -> None:
    """The invariants the layers exist for, so an edit of the table cannot drop them:
    contracts alone at the bottom, the dev tools alone at the top, and the three roles
    side by side (so none imports another)."""
    layers = doc_layers()
    by_group = {group: layer for layer, group in layers}
    assert [g for (layer, g) in layers if layer == 0] == ["contracts"]
    top = max(layer for layer, _ in layers)
    assert [g for (layer, g) in layers if layer == top] == ["dev"]
    assert by_group["agent"] == by_group["controller"] == by_group["consumers"]
    assert by_group["foundation"] < by_group["agent"] < by_group["commands"] < top


def test_new_packages_are_placed_by_the_doc_prefixes() -> None:
    """A module under a named package needs no edit anywhere; a new top-level one needs
    a row (or a name in one) in the doc, never an edit of this test."""
    assert group_of("azprobe.consumers.xds.server")[1] == "consumers"
    assert group_of("azprobe.consumers.scheduler_extender")[1] == "consumers"
    assert group_of("azprobe.controller.collect.store")[1] == "controller"
    assert group_of("azprobe.clients.tls")[1] == "foundation"
    small = parse_layers(DOC)
    assert group_of("azprobe.tls", small) is None
    with_tls = parse_layers(DOC.replace("`azprobe.config`", "`azprobe.config`, `azprobe.tls`"))
    assert group_of("azprobe.tls.certs", with_tls) == (1, "foundation")


DOC = """# x

### Layers

| layer | group | modules |
|---|---|---|
| 0 | contracts | `azprobe.contracts` |
| 1 | foundation | `azprobe` (the `__init__` only), `azprobe.config` |

### Next
"""


def test_the_table_is_parsed_from_the_doc() -> None:
    assert parse_layers(DOC) == {(0, "contracts"): ("azprobe.contracts",),
                                 (1, "foundation"): ("azprobe", "azprobe.config")}


@pytest.mark.parametrize("doc, error", [
    (DOC.replace("### Layers", "### Strata"), "no '### Layers' heading"),
    (DOC.replace("| layer | group | modules |", "| layer | modules |"), "expected a table"),
    (DOC.replace("| 1 | foundation", "| one | foundation"), "bad layer row"),
    (DOC.replace("`azprobe.config`", "`azprobe.contracts`"), "azprobe.contracts is in two groups"),
    (DOC.replace("`azprobe` (the `__init__` only), `azprobe.config`", "config and errors"), "names no"),
    (DOC.replace("| 1 | foundation", "| 1 | contracts"), "group 'contracts' has two rows"),
])
def test_a_malformed_table_is_an_error_naming_the_row(doc: str, error: str) -> None:
    with pytest.raises(LayerTableError, match=re.escape(error)):
        parse_layers(doc)


# --- the checker fails on deliberate violations ---------------------------------------------

def _modules(**sources: str) -> dict[str, Module]:
    return {name.replace("__", "."): Module(name.replace("__", "."), src) for name, src in sources.items()}


def _rules_broken(**sources: str) -> list[tuple[str, str]]:
    return [(v.module, v.imported) for v in check_imports(_modules(**sources))]


def test_controller_importing_the_dev_tools_fails_even_lazily() -> None:
    src = "def f():\n    from azprobe.dev.devconsul.testing import DevConsul\n"
    violations = check_imports(_modules(azprobe__controller__main=src))
    assert [(v.module, v.line, v.imported) for v in violations] == [
        ("azprobe.controller.main", 2, "azprobe.dev.devconsul.testing")]
    assert "controller (layer 2) may not import dev (layer 4)" in violations[0].rule


def test_agent_and_controller_never_import_each_other() -> None:
    assert _rules_broken(azprobe__agent__main="import azprobe.controller.safety\n",
                         azprobe__controller__collect="from azprobe.agent import windows\n",
                         azprobe__agent__windows="") == [
        ("azprobe.agent.main", "azprobe.controller.safety"),
        ("azprobe.controller.collect", "azprobe.agent.windows")]


def test_contracts_import_nothing_else_of_azprobe() -> None:
    assert _rules_broken(azprobe__contracts__weights="from azprobe.config import Section\nimport json\n",
                         azprobe__contracts__window="from azprobe.contracts.sketch import Histogram\n",
                         azprobe__contracts__sketch="") == [("azprobe.contracts.weights", "azprobe.config")]


def test_consumers_import_no_role_and_no_dev_tool() -> None:
    assert _rules_broken(azprobe__consumers__watch="import azprobe.controller.publish\n",
                         azprobe__consumers__explain="from azprobe.dev.lab import Lab\n",
                         azprobe__consumers__envoy="from azprobe.contracts.weights import parse_weights\n") == [
        ("azprobe.consumers.explain", "azprobe.dev.lab"), ("azprobe.consumers.watch", "azprobe.controller.publish")]


def test_tools_import_downward_but_not_the_dev_tools() -> None:
    assert _rules_broken(azprobe__commands__doctor="def f():\n    from azprobe.controller.config import load_config\n"
                                         "    from azprobe.agent.config import load_agent_config\n",
                         azprobe__commands__cli="from azprobe.dev.demo import runner\n"
                                      "COMMANDS = {'lab': 'azprobe.dev.lab.cli:lab_group'}\n") == [
        ("azprobe.commands.cli", "azprobe.dev.demo")]


def test_foundation_does_not_reach_up_and_dev_may_import_anything() -> None:
    assert _rules_broken(azprobe__clients__consul="from azprobe.controller.leader import LeaderElection\n",
                         azprobe__dev__demo__runner="import azprobe.controller.main, azprobe.agent.main\n"
                                                    "from azprobe.commands import doctor\n") == [
        ("azprobe.clients.consul", "azprobe.controller.leader")]


def test_relative_imports_are_resolved() -> None:
    modules = {"azprobe.controller": Module("azprobe.controller", "from ..dev import lab\n", is_package=True),
               "azprobe.controller.main": Module("azprobe.controller.main", "from .safety import x\n"
                                                 "from ..agent.main import Agent\n"),
               "azprobe.dev.lab": Module("azprobe.dev.lab", "")}
    assert [(v.module, v.imported) for v in check_imports(modules)] == [
        ("azprobe.controller", "azprobe.dev.lab"), ("azprobe.controller.main", "azprobe.agent.main")]


def test_old_top_level_names_and_unplaced_modules_fail() -> None:
    violations = check_imports(_modules(azprobe__controller__main="from controller.safety import x\n",
                                        azprobe__newthing=""))
    assert [(v.module, v.imported) for v in violations] == [("azprobe.controller.main", "controller.safety"),
                                                            ("azprobe.newthing", "-")]
    assert "in no layer" in violations[1].rule
