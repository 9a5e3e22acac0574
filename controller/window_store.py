"""The window store: the windows of the evaluation window, stored once each, bounded per
node, and summed per node: the quorum's evidence and the zones the views know of.

Both window sources (controller/collect.py, controller/prom_source.py) fill one. Each
window is stamped with the controller's clock shifted by the window's age on the agent's
own clock (the source's job): agent clocks may be skewed, and a backlog a new leader reads
from a ring must not count as fresh.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, replace

from azprobe.contracts.window import MAX_HOSTS, MIN_INTERVAL_S, OTHER_AZ, Window
from azprobe.controller.hosts import HostKey, HostSums
from azprobe.controller.merge import Aggregate, NodeSeen, UtilWeights, ZonesSeen, zones_seen


def node_window_cap(horizon_s: float) -> int:
    """The most windows the store holds for one node: the evaluation window at the agents'
    shortest interval, a quarter more for the pull in flight and clock jitter, and two."""
    return math.ceil(1.25 * horizon_s / MIN_INTERVAL_S) + 2


@dataclass(frozen=True)
class StoredWindow:
    window: Window
    at: float  # controller clock, shifted by the window's age on the agent's clock
    agent: str  # the target URL: the identity of the agent


class _NodeTotals:
    """One node's sums over the windows the store holds, per destination: kept up to
    date on add and prune (a window in, a window out), so the quorum's per-node input
    costs nothing per cycle (merging every node's windows each cycle cost 0.4 s of CPU at
    5,000 agents). A destination leaves with the last window that holds a path to it."""

    __slots__ = ("az", "dsts", "paths", "windows", "cpu", "mem", "hosts", "hosts_over_cap")

    def __init__(self, az: str) -> None:
        self.az = az
        self.dsts: dict[str, Aggregate] = {}
        self.paths: dict[str, int] = {}  # dst -> the paths to it in the windows held
        self.windows = 0
        self.cpu = 0.0  # utilisation summed over the windows
        self.mem = 0.0
        self.hosts: dict[HostKey, HostSums] = {}  # (dst, addr): at most MAX_HOSTS per node
        self.hosts_over_cap = 0

    def add_hosts(self, window: Window) -> Window:
        """Sum the window's hosts; returns the window holding only those summed (so that
        remove() takes back exactly what add() put in). A node whose sums already hold
        MAX_HOSTS addresses adds no new one: an agent rotating addresses cannot grow them."""
        if not window.hosts:
            return window
        kept = []
        for h in window.hosts:
            if h.dst == OTHER_AZ:
                continue
            key = (h.dst, h.addr)
            sums = self.hosts.get(key)
            if sums is None:
                if len(self.hosts) >= MAX_HOSTS:
                    self.hosts_over_cap += 1
                    continue
                sums = self.hosts[key] = HostSums()
            sums.add(h)
            kept.append(h)
        return window if len(kept) == len(window.hosts) else replace(window, hosts=kept)

    def remove_hosts(self, window: Window) -> None:
        for h in window.hosts:
            key = (h.dst, h.addr)
            sums = self.hosts.get(key)
            if sums is not None:
                sums.add(h, -1)
                if sums.empty:
                    del self.hosts[key]

    def add(self, window: Window) -> None:
        self.az = window.az  # the newest window's AZ
        self.windows += 1
        self.cpu += window.util.cpu
        self.mem += window.util.mem
        paths = self.paths
        for p in window.paths:
            dst = p.dst
            if dst != OTHER_AZ:
                agg = self.dsts.get(dst)
                if agg is None:
                    agg = self.dsts[dst] = Aggregate()
                    paths[dst] = 1
                else:
                    paths[dst] += 1
                agg.merge(p)

    def remove(self, window: Window) -> None:
        self.windows -= 1
        self.cpu -= window.util.cpu
        self.mem -= window.util.mem
        if window.hosts:
            self.remove_hosts(window)
        paths = self.paths
        for p in window.paths:
            dst = p.dst
            agg = self.dsts.get(dst)
            if agg is None:
                continue
            if paths[dst] == 1:  # the last path to dst: nothing else is summed in its Aggregate
                del paths[dst], self.dsts[dst]
                continue
            paths[dst] -= 1
            agg.subtract(p)


class WindowStore:
    """Windows of the last `horizon_s` seconds; a key is stored once, ever within the horizon,
    and a node holds at most `max_node_windows` (node_window_cap) at once.

    Windows leave in `at` order. Arrivals are only roughly ordered (each agent's backlog is
    back-dated by its own age), and pruning must stay O(log n) per window at 25,000+: those
    that arrive in order (nearly all: one window a pull, stamped with the clock) queue, the
    others wait in a heap, and prune takes the older of the two heads.
    Every window is summed into its node's totals on the way in and taken out of them on
    the way out; nothing else reads the windows themselves each cycle.
    """

    def __init__(self, horizon_s: float) -> None:
        self.horizon_s = horizon_s
        # (at, tiebreak, agent, window): tiebreak orders those of one `at` by arrival. A heap
        # pop costs ~15 tuple comparisons at 25,000 windows, a queue's none.
        self._queue: deque[tuple[float, int, str, Window]] = deque()  # in order: each at >= the last's
        self._heap: list[tuple[float, int, str, Window]] = []  # the others
        self._keys: set[tuple[str, float]] = set()  # (node, end): one window per end per node
        self.agent_node: dict[str, str] = {}  # agent URL -> the node it spoke for last
        self._nodes: dict[str, _NodeTotals] = {}
        self._tiebreak = 0
        self.newest_at: float | None = None
        self.max_node_windows = node_window_cap(horizon_s)

    def room(self, node: str) -> int:
        """How many more windows `node` may add before its cap."""
        totals = self._nodes.get(node)
        return self.max_node_windows - (totals.windows if totals is not None else 0)

    def add(self, agent: str, window: Window, at: float) -> bool:
        """Store one window; False when this (node, end) is already held or the node is at its cap."""
        key = (window.node, window.end)
        if key in self._keys or self.room(window.node) <= 0:
            return False
        self._keys.add(key)
        self.agent_node[agent] = window.node
        totals = self._nodes.get(window.node)
        if totals is None:
            totals = self._nodes[window.node] = _NodeTotals(window.az)
        totals.add(window)
        if window.hosts:
            window = totals.add_hosts(window)
        self._tiebreak += 1
        entry = (at, self._tiebreak, agent, window)
        if not self._queue or at >= self._queue[-1][0]:
            self._queue.append(entry)
        else:
            heapq.heappush(self._heap, entry)
        if self.newest_at is None or at > self.newest_at:
            self.newest_at = at
        return True

    def prune(self, now: float) -> None:
        cutoff = now - self.horizon_s
        queue, heap, keys, nodes = self._queue, self._heap, self._keys, self._nodes  # a fifth leave each second
        while True:
            if heap and heap[0][0] < cutoff and not (queue and queue[0] < heap[0]):
                window = heapq.heappop(heap)[3]
            elif queue and queue[0][0] < cutoff:
                window = queue.popleft()[3]
            else:
                break
            node = window.node
            keys.discard((node, window.end))
            totals = nodes[node]
            totals.remove(window)
            if totals.windows <= 0:
                del nodes[node]

    def windows(self) -> list[Window]:
        return [entry[3] for entry in (*self._queue, *self._heap)]

    def _spoken_for(self) -> dict[str, _NodeTotals]:
        """The nodes some agent URL speaks for last: one URL that renamed itself is one
        vantage point, not one per name it held within the horizon."""
        voices = set(self.agent_node.values())
        return {node: t for node, t in self._nodes.items() if node in voices}

    def zones_seen(self, weights: UtilWeights = UtilWeights()) -> ZonesSeen:
        """The zones the views know of and their utilisation, from the sums of the nodes
        the quorum judges (node_input), so a URL counts once in its AZ's utilisation as
        in its votes (controller/merge.py)."""
        return zones_seen((NodeSeen(t.az, t.dsts, t.cpu / t.windows, t.mem / t.windows)
                           for t in self._spoken_for().values()), weights)

    def node_input(self) -> dict[str, tuple[str, dict[str, Aggregate]]]:
        """Per node of the evaluation window that some agent URL speaks for last (_spoken_for):
        (its AZ, dst -> summed counters and histograms), the vantage points the quorum
        judges (controller/quorum.py). The sums are the store's own: read, don't keep."""
        return {node: (t.az, t.dsts) for node, t in self._spoken_for().items()}

    def node_hosts(self) -> dict[str, dict[HostKey, HostSums]]:
        """Per node (as node_input speaks for it), its sums per (dst, address), for the
        nodes whose windows carry the hosts section. Read, don't keep."""
        return {node: t.hosts for node, t in self._spoken_for().items() if t.hosts}

    def forget_agent(self, agent: str) -> None:
        self.agent_node.pop(agent, None)

    def items(self) -> list[StoredWindow]:
        return [StoredWindow(window, at, agent) for at, _, agent, window in sorted((*self._queue, *self._heap))]

    def __len__(self) -> int:
        return len(self._queue) + len(self._heap)
