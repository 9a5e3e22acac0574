"""The AZ set is the controller's, not the agents' (docs/quorum.md "Topology").

`[topology] azs = ["az-a", "az-b", "az-c"]` lists the AZs weights are published for.
Everything an agent sends is filtered through it before it reaches any state: a window
whose own `az` is not configured is dropped whole; a path whose `src` is not the window's
own `az` (a node measures its own connections, so its source is its own AZ), or whose
`dst` is neither configured nor `other`, is dropped, and so is a host summary whose
`src` is not the window's `az` or whose `dst` is not configured. Each drop is counted (metrics
`azprobe_controller_topology_*_total`) and logged at most once a minute with the
counts, so detector state, metric series, views and `weights/from/<src>` keys can never
outgrow the configured AZs whatever names agents invent.

`azs` is required: with no list, the first names agents report would win, and one agent
inventing five AZs would take five shares of the traffic.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from azprobe.config import Section
from azprobe.contracts.weights import MAX_ZONES
from azprobe.contracts.window import AZ_NAME_FIX, OTHER_AZ, Window, az_name_problem, printable
from azprobe.errors import ConfigError

log = logging.getLogger(__name__)

LOG_EVERY_S = 60.0
AZS_HELP = 'list your AZs, e.g. azs = ["az-a", "az-b", "az-c"] (docs/quorum.md)'


@dataclass(frozen=True)
class TopologySettings:
    azs: tuple[str, ...]


def parse_topology(section: Section) -> TopologySettings:
    if not section.has("azs"):
        raise ConfigError(section.field("azs"), "is required", AZS_HELP)
    azs = section.string_list("azs")
    section.reject_unknown()
    if not azs:
        raise ConfigError(section.field("azs"), "is empty", AZS_HELP)
    for az in azs:
        problem = az_name_problem(az)
        if problem:
            raise ConfigError(section.field("azs"), f"{printable(az, 40)!r} {problem}", AZ_NAME_FIX)
    if len(set(azs)) != len(azs):
        raise ConfigError(section.field("azs"), "lists an AZ twice", "list each AZ once")
    if len(azs) > MAX_ZONES:
        raise ConfigError(section.field("azs"), f"{len(azs)} AZs exceed {MAX_ZONES}",
                          f"a weights document holds at most {MAX_ZONES} zones")
    return TopologySettings(azs=tuple(azs))


@dataclass
class TopologyCounters:
    windows_unknown_az: int = 0  # the window's own az is not configured: dropped whole
    paths_foreign_src: int = 0  # src is not the window's own az
    paths_unknown_dst: int = 0  # dst is neither configured nor `other`
    hosts_foreign: int = 0  # a host summary whose src is not the window's az, or whose dst is not configured


@dataclass
class Topology:
    """The admitted AZ set and the filter every window passes through."""

    settings: TopologySettings
    clock: Callable[[], float] = time.monotonic
    counters: TopologyCounters = field(default_factory=TopologyCounters)
    _logged_at: float = float("-inf")
    _logged: TopologyCounters = field(default_factory=TopologyCounters)

    @property
    def azs(self) -> tuple[str, ...]:
        return self.settings.azs

    def knows(self, az: str) -> bool:
        return az in self.settings.azs

    def admit(self, window: Window) -> Window | None:
        """The window with only the paths the topology allows; None to drop it whole."""
        c = self.counters
        azs = self.settings.azs  # knows(), in line: this runs for every path of every window
        az = window.az
        if az not in azs:
            c.windows_unknown_az += 1
            self._report(window)
            return None
        for p in window.paths:
            if p.src != az or (p.dst != OTHER_AZ and p.dst not in azs):
                break
        else:
            if not window.hosts:
                return window  # nearly every window: nothing to drop, nothing to count
        kept = []
        for p in window.paths:
            if p.src != az:
                c.paths_foreign_src += 1
            elif p.dst != OTHER_AZ and p.dst not in azs:
                c.paths_unknown_dst += 1
            else:
                kept.append(p)
        hosts = [h for h in window.hosts if h.src == az and h.dst in azs]
        if len(hosts) != len(window.hosts):
            c.hosts_foreign += len(window.hosts) - len(hosts)
        if len(kept) != len(window.paths) or len(hosts) != len(window.hosts):
            self._report(window)
            return replace(window, paths=kept, hosts=hosts)
        return window

    def _report(self, window: Window) -> None:
        """At most one line a minute, with what was dropped since the last one."""
        now = self.clock()
        if now - self._logged_at < LOG_EVERY_S:
            return
        c, last = self.counters, self._logged
        log.warning("topology: dropped %d windows of unknown AZs, %d paths with a foreign src, %d paths to unknown "
                    "AZs since the last report (e.g. node %s, az %s); AZs are %s",
                    c.windows_unknown_az - last.windows_unknown_az, c.paths_foreign_src - last.paths_foreign_src,
                    c.paths_unknown_dst - last.paths_unknown_dst, printable(window.node, 64),
                    printable(window.az, 64), ", ".join(self.azs))
        self._logged_at = now
        self._logged = replace(c)
