"""Import directions of the azprobe package, read statically (ast) from every module.

The package is a stack of layers; a module may import its own group and any group of a
LOWER layer, nothing else:

  0  contracts    azprobe.contracts (window, weights, sketch): imports nothing else of azprobe
  1  foundation   azprobe (the package), azprobe.errors, azprobe.config, azprobe.bpf, and
                  two subpackages that know no role: azprobe.clients (the HTTP transport,
                  the agent's windows API, Consul) and azprobe.daemon (systemd notify,
                  address files)
  2  roles        azprobe.agent | azprobe.controller | azprobe.consumers: three separate
                  groups, so agent and controller never import each other, and consumers
                  (weights CLI, watcher, envoy-eds, explain) import neither
  3  commands     azprobe.commands (cli, doctor, top, trace): the operator's top-level
                  commands. They import downward, which includes the roles: the doctor
                  checks an agent's or controller's config with the daemon's own parser
                  (azprobe.agent.config, azprobe.controller.config) and compiles the probe
                  with the agent's loader (azprobe.agent.probe), so it tests what the
                  daemon will do, not a copy of it
  4  dev          azprobe.dev (lab, devconsul, demo): may import anything; nothing imports it

So production code (everything but azprobe.dev) never imports azprobe.dev. The CLI's lazy
"module:attr" table in azprobe/commands/cli.py names dev tools in strings; strings are not
imports (a node install leaves azprobe.dev out and the CLI says so).

Every import statement counts, also one inside a function (a lazy import is still a
dependency) or under `if TYPE_CHECKING:`. A module in no layer fails the check: a new
top-level module must be placed in LAYERS below, deliberately.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Source folder -> package name it is installed as (pyproject.toml [tool.setuptools.package-dir]).
PACKAGE_DIRS = {"azprobe": "azprobe", "agent": "azprobe.agent", "controller": "azprobe.controller",
                "bpf": "azprobe.bpf"}

# (layer, group) -> module-name prefixes. A name belongs to the group of its longest prefix;
# "azprobe" itself is the package's __init__ only (azprobe.newthing is in no layer).
LAYERS: dict[tuple[int, str], tuple[str, ...]] = {
    (0, "contracts"): ("azprobe.contracts",),
    (1, "foundation"): ("azprobe", "azprobe.errors", "azprobe.config", "azprobe.clients", "azprobe.daemon",
                        "azprobe.bpf"),
    (2, "agent"): ("azprobe.agent",),
    (2, "controller"): ("azprobe.controller",),
    (2, "consumers"): ("azprobe.consumers",),
    (3, "commands"): ("azprobe.commands",),
    (4, "dev"): ("azprobe.dev",),
}

# The mapped folders' own names: importing them is a bug (they are not installed).
OLD_TOP_LEVEL = ("agent", "controller", "bpf")


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


def group_of(name: str) -> tuple[int, str] | None:
    """(layer, group) of a module name, by its longest matching prefix; None if unplaced."""
    best: tuple[int, tuple[int, str]] | None = None
    for key, prefixes in LAYERS.items():
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
    """Every import that breaks the layering above (pure: module name -> source)."""
    known = set(modules)
    violations: list[Violation] = []
    for module in modules.values():
        here = group_of(module.name)
        if here is None:
            violations.append(Violation(module.name, 0, "-", "module is in no layer: add it to LAYERS in "
                                        "tests/unit/test_import_directions.py"))
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
