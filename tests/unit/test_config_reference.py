"""docs/contracts.md's "Agent config" and "Controller config" tables list exactly the keys
the daemons' loaders read, with the loaders' defaults.

Both loaders read every table through azprobe.config.Section, so the test records what
they ask a Section for (every key read, with its default, and every key probed with
`has`) while they load configs that take every branch (the Prometheus source, each
model), and compares that with the tables:

- a row whose first cell is `` `[table]` `` lists that table's keys in its second cell:
  every backticked word outside parentheses is a key; a parenthesised group right after a
  key is what the key defaults to, or says why there is no plain default;
- a row whose first cell is `` `table.key` `` is one key, its default in the second cell;
- a default is checked when it is a number or one backticked literal, alone or followed by
  `;`, `:` or `,` (`(0.5: ...)`, `` (`direct`; ...) ``); any other text is prose
  ("host name", "the model's", "3 × ...").

A key read but not listed, a key listed but not read, or a listed default the loader
does not use fails the test with the key's full name.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from azprobe.agent.config import parse_agent_config
from azprobe.config import Section
from azprobe.consumers.scheduler.config import parse_extender_config
from azprobe.controller.config import parse_config
from azprobe.controller.models import MODEL_NAMES

CONTRACTS = Path(__file__).resolve().parents[2] / "docs" / "contracts.md"
AGENT_HEADING, CONTROLLER_HEADING, XDS_HEADING = "Agent config", "Controller config", "xDS server config"
EXTENDER_HEADING = "Scheduler extender config"
_NO_DEFAULT = object()  # a key probed with `has`: no default given


# --- what the loaders read ----------------------------------------------------------------

@dataclass
class Reads:
    """Tables and keys a loader asked Section for, across every load recorded."""

    tables: set[str]
    defaults: dict[tuple[str, str], list[Any]]  # (table, key) -> defaults passed

    def keys(self) -> dict[tuple[str, str], list[Any]]:
        """(table, key) of every plain key: not a root entry, not a nested table."""
        return {(table, key): d for (table, key), d in self.defaults.items()
                if table and f"{table}.{key}" not in self.tables}


def record_reads(monkeypatch: pytest.MonkeyPatch, loads: list[Callable[[], Any]]) -> Reads:
    tables: set[str] = set()
    defaults: dict[tuple[str, str], list[Any]] = defaultdict(list)
    init, get, has = Section.__init__, Section._get, Section.has

    def recording_init(self: Section, data: Any, name: str) -> None:
        init(self, data, name)
        tables.add(name)

    def recording_get(self: Section, key: str, default: Any) -> Any:
        defaults[(self.name, key)].append(default)
        if not self.name:
            tables.add(key)  # every root entry is a table
        return get(self, key, default)

    def recording_has(self: Section, key: str) -> bool:
        defaults[(self.name, key)].append(_NO_DEFAULT)
        if not self.name:
            tables.add(key)
        return has(self, key)

    with monkeypatch.context() as patched:
        patched.setattr(Section, "__init__", recording_init)
        patched.setattr(Section, "_get", recording_get)
        patched.setattr(Section, "has", recording_has)
        for load in loads:
            load()
    tables.discard("")
    return Reads(tables, dict(defaults))


# --- what the doc lists ---------------------------------------------------------------------

@dataclass(frozen=True)
class Listed:
    table: str
    key: str
    default: str | None  # the text that states the default, or None without one


_TABLE_CELL = re.compile(r"`\[([a-z][a-z0-9_.-]*)\]`")
_KEY_CELL = re.compile(r"`([a-z][a-z0-9_]*)\.([a-z][a-z0-9_]*|<[a-z]+>)`")
_KEY = re.compile(r"[a-z][a-z0-9_]*|<[a-z]+>")
_LITERAL = re.compile(r"(?:`(?P<text>[^`]*)`|(?P<number>-?\d+(?:\.\d+)?))\s*(?:$|[;:,])")


def section_rows(markdown: str, heading: str) -> list[list[str]]:
    """The cells of every table row under `## heading`, header and rule rows left out."""
    parts = ("\n" + markdown).split(f"\n## {heading}\n", 1)
    assert len(parts) == 2, f"no section '## {heading}'"
    body = parts[1].split("\n## ", 1)[0]
    rows = [line for line in body.splitlines() if line.startswith("|")]
    cells = [[c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows]
    return [c for c in cells[1:] if not set("".join(c)) <= set("-: ")]


def top_level_items(cell: str) -> Iterator[tuple[str, str]]:
    """("code", text) for each backticked span and ("group", text) for each parenthesised
    group at the top level of `cell`, ("gap", text) for what lies between them."""
    i, gap = 0, ""
    while i < len(cell):
        ch = cell[i]
        if ch == "`":
            end = cell.index("`", i + 1)
            yield "gap", gap
            yield "code", cell[i + 1:end]
            gap, i = "", end + 1
        elif ch == "(":
            depth, j = 0, i
            while True:
                if cell[j] == "`":
                    j = cell.index("`", j + 1)
                elif cell[j] == "(":
                    depth += 1
                elif cell[j] == ")":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            yield "gap", gap
            yield "group", cell[i + 1:j]
            gap, i = "", j + 1
        else:
            gap += ch
            i += 1
    yield "gap", gap


def keys_of_cell(table: str, cell: str) -> list[Listed]:
    listed: list[Listed] = []
    items = [item for item in top_level_items(cell) if item != ("gap", "")]
    for n, (kind, text) in enumerate(items):
        if kind != "code":
            continue
        assert _KEY.fullmatch(text), f"[{table}]: `{text}` is not a key name (only keys go in backticks " \
                                     f"outside parentheses)"
        follows = items[n + 1] if n + 1 < len(items) else None
        if follows and follows[0] == "gap" and not follows[1].strip() and n + 2 < len(items):
            follows = items[n + 2]
        listed.append(Listed(table, text, follows[1] if follows and follows[0] == "group" else None))
    return listed


def listed_keys(markdown: str, heading: str) -> tuple[set[str], list[Listed]]:
    """The tables and keys one config section of contracts.md lists."""
    tables: set[str] = set()
    listed: list[Listed] = []
    for cells in section_rows(markdown, heading):
        first, second = cells[0], cells[1] if len(cells) > 1 else ""
        if m := _TABLE_CELL.fullmatch(first):
            tables.add(m[1])
            listed += keys_of_cell(m[1], second)
        elif m := _KEY_CELL.fullmatch(first):
            tables.add(m[1])
            listed.append(Listed(m[1], m[2], second))
        else:
            raise AssertionError(f"{heading}: a row must start with `[table]` or `table.key`, not {first!r}")
    return tables, listed


def stated_default(text: str | None) -> str | float | None:
    """The default a doc's text states: a number, a backticked literal, or None (prose)."""
    m = _LITERAL.match((text or "").strip())
    if not m:
        return None
    return float(m["number"]) if m["number"] is not None else m["text"]


def reference_problems(heading: str, markdown: str, reads: Reads,
                       names: dict[str, str] | None = None) -> list[str]:
    """Every disagreement between one config section of the doc and what its loader read.
    `names`: table -> placeholder for tables whose keys are names the config chose
    (the agent's [topology] AZs are `<az>`)."""
    names = names or {}
    read: dict[tuple[str, str], list[Any]] = {}
    for (table, key), defaults in reads.keys().items():
        read.setdefault((table, names.get(table, key)), []).extend(defaults)
    tables, listed = listed_keys(markdown, heading)
    problems = [f"table [{t}] is read but not listed" for t in sorted(reads.tables - tables)]
    problems += [f"table [{t}] is listed but not read" for t in sorted(tables - reads.tables)]
    doc = {(item.table, item.key): item for item in listed}
    problems += [f"{t}.{k} is read but not listed" for t, k in sorted(set(read) - set(doc))]
    problems += [f"{t}.{k} is listed but not read" for t, k in sorted(set(doc) - set(read))]
    for (table, key), item in sorted(doc.items()):
        stated = stated_default(item.default)
        if stated is None or (table, key) not in read:
            continue
        used = [d for d in read[(table, key)] if d is not _NO_DEFAULT]
        matches = [d for d in used if (isinstance(stated, float) and isinstance(d, (int, float))
                                       and not isinstance(d, bool) and float(d) == stated) or d == stated]
        if not matches:
            problems.append(f"{table}.{key}: listed default {item.default.strip()!r}, the loader's {used!r}")
    return [f"docs/contracts.md \"{heading}\": {p}" for p in problems]


# --- the configs that take every branch -----------------------------------------------------

AGENT = {"node": {"az": "az-a"}, "topology": {"az-a": ["198.18.1.0/24"], "az-b": ["198.18.2.0/24"]}}
TOPOLOGY = {"topology": {"azs": ["az-a", "az-b", "az-c"]}}
DIRECT = {**TOPOLOGY, "agents": {"static": ["http://198.18.1.2:9740"]}}
PROMETHEUS = {**TOPOLOGY, "agents": {"source": "prometheus"}, "prometheus": {"url": "http://127.0.0.1:9090"}}
MUTUAL_TLS = {**TOPOLOGY, "agents": {"static": ["https://198.18.1.2:9740"], "identity": "spiffe://lab/node/{node}",
                                     "tls": {"cert_file": "/c.pem", "key_file": "/k.pem", "ca_file": "/ca.pem"}}}


def controller_loads() -> list[Callable[[], Any]]:
    """The direct pull and the Prometheus source, each model."""
    loads: list[Callable[[], Any]] = []
    for source in (DIRECT, PROMETHEUS):
        for model in MODEL_NAMES:
            loads.append(lambda source=source, model=model: parse_config({**source, "model": {"name": model}}))
    loads.append(lambda: parse_config(MUTUAL_TLS))  # the files are loaded by the controller, not the parser
    return loads


@pytest.fixture(autouse=True)
def _no_consul_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CONSUL_HTTP_ADDR", "CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE", "CONSUL_CACERT"):
        monkeypatch.delenv(name, raising=False)


def test_the_agent_config_table_lists_what_the_loader_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    with_tls = {**AGENT, "agent": {"tls": {"cert_file": "/c.pem", "key_file": "/k.pem", "ca_file": "/ca.pem",
                                           "client_identity": "spiffe://lab/controller"}}}
    reads = record_reads(monkeypatch, [lambda: parse_agent_config(AGENT), lambda: parse_agent_config(with_tls)])
    assert {"node", "agent", "topology"} <= reads.tables  # the recorder saw the loader
    problems = reference_problems(AGENT_HEADING, CONTRACTS.read_text(), reads, names={"topology": "<az>"})
    assert not problems, "\n".join(problems)


def test_the_controller_config_table_lists_what_the_loader_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = record_reads(monkeypatch, controller_loads())
    assert {"prometheus", "model.default", "quorum", "topology"} <= reads.tables
    assert ("agents", "forget_after_s") in reads.keys()  # read only when set: probed with `has`
    problems = reference_problems(CONTROLLER_HEADING, CONTRACTS.read_text(), reads)
    assert not problems, "\n".join(problems)


def test_the_xds_config_table_lists_what_the_loader_reads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from azprobe.consumers.xds.config import parse_xds_config

    endpoints = tmp_path / "backend.json"
    endpoints.write_text('{"az-a": ["198.18.1.2:8080"]}')
    config = {"topology": {"az-a": ["198.18.1.0/24"]},
              "service": [{"name": "backend", "endpoints_file": str(endpoints)}, {"name": "api", "consul_service": "api"}]}
    with_tls = {**config, "xds": {"tls": {"cert_file": "/etc/x.crt", "key_file": "/etc/x.key", "ca_file": "/etc/ca.crt"}}}
    reads = record_reads(monkeypatch, [lambda: parse_xds_config(config), lambda: parse_xds_config(with_tls)])
    assert {"xds", "xds.tls", "consul", "topology", "service"} <= reads.tables
    problems = reference_problems(XDS_HEADING, CONTRACTS.read_text(), reads, names={"topology": "<az>"})
    assert not problems, "\n".join(problems)


EXTENDER = {"nodes": {"name_patterns": ["(?P<zone>az-[a-c])-.*"], "zones": {"node-1": "az-a"}}}


def test_the_scheduler_extender_config_table_lists_what_the_loader_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = record_reads(monkeypatch, [lambda: parse_extender_config(EXTENDER)])
    assert {"extender", "consul", "weights", "nodes", "nodes.zones"} <= reads.tables
    problems = reference_problems(EXTENDER_HEADING, CONTRACTS.read_text(), reads, names={"nodes.zones": "<node>"})
    assert not problems, "\n".join(problems)


# --- the checker itself ---------------------------------------------------------------------

_DOC = """\
## Controller config

| table | keys |
|---|---|
| `[agents]` | `static` (agent URLs), `source` (`direct`; or `prometheus` \\| `x`), `concurrency` (1024) ([scale.md](scale.md)) |
| `[model.default]` | `w_failure` (0.5: the weight of failures) |

## Agent config

| table.key | default | meaning |
|---|---|---|
| `agent.listen` | `0.0.0.0:9740` | where |
| `topology.<az>` | | CIDRs |

## Metrics
"""


def test_the_tables_are_parsed_into_keys_and_defaults() -> None:
    tables, listed = listed_keys(_DOC, CONTROLLER_HEADING)
    assert tables == {"agents", "model.default"}
    assert [(i.table, i.key, stated_default(i.default)) for i in listed] == [
        ("agents", "static", None), ("agents", "source", "direct"), ("agents", "concurrency", 1024.0),
        ("model.default", "w_failure", 0.5)]
    tables, listed = listed_keys(_DOC, AGENT_HEADING)
    assert [(i.table, i.key, stated_default(i.default)) for i in listed] == [
        ("agent", "listen", "0.0.0.0:9740"), ("topology", "<az>", None)]


def test_a_missing_key_an_extra_key_and_a_wrong_default_are_named() -> None:
    reads = Reads(tables={"agents", "model.default", "prometheus"},
                  defaults={("agents", "static"): [[]], ("agents", "source"): ["direct"],
                            ("agents", "concurrency"): [512], ("model.default", "w_failure"): [0.5],
                            ("prometheus", "url"): [""]})
    assert reference_problems(CONTROLLER_HEADING, _DOC, reads) == [
        'docs/contracts.md "Controller config": table [prometheus] is read but not listed',
        'docs/contracts.md "Controller config": prometheus.url is read but not listed',
        "docs/contracts.md \"Controller config\": agents.concurrency: listed default '1024', the loader's [512]"]
    reads.defaults.pop(("agents", "source"))
    assert 'docs/contracts.md "Controller config": agents.source is listed but not read' in \
        reference_problems(CONTROLLER_HEADING, _DOC, reads)


def test_a_non_key_in_backticks_is_refused() -> None:
    with pytest.raises(AssertionError, match="`CONSUL_HTTP_ADDR` is not a key name"):
        keys_of_cell("consul", "`address`; `CONSUL_HTTP_ADDR` fills it when unset")
