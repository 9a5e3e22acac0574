"""What the controller's cycle reads windows from: the direct pull (controller/collect.py)
or Prometheus (controller/prom_source.py), both a `WindowSource`. The records they share
(an agent target, its cursor and state, the counters, one pull's result) live here, so
neither source borrows from the other.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from azprobe.contracts.window import Window
from azprobe.controller.config import AgentsSettings
from azprobe.controller.topology import Topology
from azprobe.controller.window_store import WindowStore


class AgentState(str, enum.Enum):
    UP = "up"  # answered the last pull, and sent a new window recently
    STALE = "stale"  # answers, but has sent no new window for stale_after_s
    FAILING = "failing"  # the last pull failed: timeout, refused, HTTP error, bad JSON


@dataclass(frozen=True)
class AgentTarget:
    """One agent to pull; `url` is its base URL (…/v1/windows is appended)."""

    url: str
    az: str | None = None  # the AZ the catalog says it is in (informational)
    node: str | None = None


@dataclass
class AgentCursor:
    target: AgentTarget
    boot_id: str | None = None
    last_seq: int = 0
    node: str | None = None
    az: str | None = None
    last_ok: float | None = None  # controller clock of the last successful pull
    last_new_window: float | None = None  # ... of the last pull that brought a new window
    newest_end: float | None = None  # agent clock: `end` of the newest window seen
    last_attempt: float = float("-inf")  # controller clock of the cycle that last pulled it
    failures: int = 0  # consecutive failed pulls
    last_error: str = ""
    restart_logged_at: float = float("-inf")  # one "restarted" line a minute: a boot_id churner spams none

    def state(self, now: float, stale_after_s: float) -> AgentState:
        if self.failures or self.last_ok is None:
            return AgentState.FAILING
        if self.last_new_window is None or now - self.last_new_window > stale_after_s:
            return AgentState.STALE
        return AgentState.UP


@dataclass
class CollectCounters:
    """Monotonic totals since start; metrics export them as counters."""

    windows_ingested: int = 0
    windows_garbage: int = 0
    windows_duplicate: int = 0
    windows_too_old: int = 0  # backlog older than the evaluation window: cursor moves on
    windows_over_cap: int = 0  # the node already holds node_window_cap windows: cursor moves on
    answers_refused: int = 0  # no node name, or a name this URL may not speak for (Identities)
    gap_windows: int = 0  # windows an agent's ring dropped before we could read them
    gap_events: int = 0
    agent_restarts: int = 0
    pull_errors: int = 0
    pull_timeouts: int = 0
    pull_overruns: int = 0  # a cycle found the previous answer still being read: it waited, sent nothing


@dataclass
class PullResult:
    """What one cycle's pull did; the totals live in Collector.counters."""

    duration_s: float = 0.0
    ingested: int = 0
    failed: int = 0
    states: dict[str, int] = field(default_factory=dict)



def count_states(cursors: Iterable[AgentCursor], now: float, stale_after_s: float) -> dict[AgentState, int]:
    """How many agents are in each state (AgentCursor.state)."""
    out = {s: 0 for s in AgentState}
    for cursor in cursors:
        out[cursor.state(now, stale_after_s)] += 1
    return out


def pull_budget(pull_timeout_s: float, interval_s: float) -> float:
    """However many agents time out, a direct pull ends by this budget."""
    return max(pull_timeout_s * 2, interval_s * 0.8)


class WindowSource(Protocol):
    """One source of windows for the cycle. Called on the event loop only."""

    store: WindowStore  # the evaluation window the cycle merges and the quorum judges
    counters: CollectCounters
    topology: Topology

    @property
    def cursors(self) -> Mapping[str, AgentCursor]: ...

    def set_targets(self, targets: Iterable[AgentTarget]) -> None:
        """Replace the agents to read (known ones keep their cursors)."""

    async def pull_all(self) -> PullResult:
        """Read every agent once, within the cycle budget."""

    def take_new(self) -> list[Window]:
        """Windows stored since the last call, each once: the spike detector's input."""

    def agent_states(self, now: float | None = None) -> dict[AgentState, int]:
        """How many agents are in each state."""

    def apply_settings(self, agents: AgentsSettings, *, stale_after_s: float, interval_s: float) -> None:
        """A reload's [agents] settings and safety.stale_after_s, from the next pull on."""

    async def close(self) -> None:
        """Release connections and threads."""
