"""Where the xDS server's inputs come from: endpoints (a static file or the Consul
catalog) and the weights documents (one WeightWatcher per view).

Catalog instances are placed in an AZ by the agents' [topology] (address -> AZ). An
instance whose address is in no AZ is left out of the assignment (a locality azprobe
cannot name is one its weights cannot steer), logged, and counted in
azprobe_xds_endpoints_outside_topology, so it is visible, never silently dropped.

Fail-static: a catalog read that fails, or that lists no instance in any AZ, keeps the
last endpoints that had one; the watchers keep their last-known-good documents.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from azprobe.clients.consul import (ConsulError, ConsulSettings, backoff_delay, make_client, next_index,
                                    rate_limit_delay, read_service)
from azprobe.consumers.localities import Endpoint, sick_addresses
from azprobe.consumers.watch import WeightWatcher
from azprobe.contracts import kv
from azprobe.contracts.weights import WeightsDoc
from azprobe.contracts.weights_hosts import parse_hosts

log = logging.getLogger(__name__)

Networks = Mapping[str, Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]]
GLOBAL_VIEW = "global"


def place_instances(instances: Sequence[tuple[str, int]],
                    topology: Networks) -> tuple[dict[str, list[Endpoint]], int, int]:
    """(AZ -> endpoints, instances outside every AZ or not a usable IP, duplicate
    instances served once). Pure."""
    by_az: dict[str, list[Endpoint]] = {}
    seen: set[Endpoint] = set()
    outside = duplicates = 0
    for address, port in instances:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            outside += 1  # a name, not an IP: EDS endpoints must be IPs
            continue
        if getattr(ip, "scope_id", None):
            outside += 1  # fe80::1%eth0: the zone names one host's interface, no EDS address carries it
            continue
        if not 0 < port < 65536:
            outside += 1
            continue
        az = next((az for az, nets in topology.items() if any(ip in net for net in nets)), None)
        if az is None:
            outside += 1
            continue
        # Consul's strings are deduplicated as written, so 2001:db8::1, 2001:DB8::1 and
        # 2001:db8:0::1 arrive as three instances of one host; served three times, gRPC
        # clients reject the whole assignment. The key is the canonical (address, port)
        # across the whole service; the copy kept is the first in `instances` order, and
        # as an address's AZ is the first topology AZ holding it, every copy would land
        # in the same AZ anyway: the result does not depend on the order.
        endpoint = (str(ip), port)
        if endpoint in seen:
            duplicates += 1
            continue
        seen.add(endpoint)
        by_az.setdefault(az, []).append(endpoint)
    return by_az, outside, duplicates


class CatalogSource:
    """A blocking watch on /v1/health/service/NAME?passing (one thread)."""

    def __init__(self, settings: ConsulSettings, service: str, topology: Networks,
                 on_change: Callable[[], None], *, wait_s: float = 30.0, min_interval_s: float = 0.1,
                 backoff_base_s: float = 0.2, backoff_cap_s: float = 5.0) -> None:
        self.settings, self.service, self.topology, self.on_change = settings, service, topology, on_change
        self.wait_s, self.min_interval_s = wait_s, min_interval_s
        self.backoff_base_s, self.backoff_cap_s = backoff_base_s, backoff_cap_s
        self.endpoints: dict[str, list[Endpoint]] = {}  # last good: at least one endpoint, or never had one
        self.outside = 0
        self.duplicates = 0  # instances whose canonical address:port another one already has
        self.errors = 0
        self.changed_at: float | None = None  # monotonic time the last change was read
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "CatalogSource":
        self._thread = threading.Thread(target=self._run, name=f"catalog:{self.service}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        import random

        client = make_client(self.settings)
        index, failures, last_started = 0, 0, None
        rng = random.Random()
        while not self._stop.is_set():
            if self._stop.wait(rate_limit_delay(last_started, time.monotonic(), self.min_interval_s)):
                return
            last_started = time.monotonic()
            try:
                state = read_service(client, self.service, index=index, wait_s=self.wait_s)
            except ConsulError as exc:
                self.errors += 1
                failures += 1
                index = 0
                log.warning("catalog watch %s: %s (keeping the last endpoints)", self.service, exc)
                if self._stop.wait(backoff_delay(failures - 1, self.backoff_base_s, self.backoff_cap_s, rng)):
                    return
                continue
            failures = 0
            index = next_index(index, state.index)
            by_az, outside, duplicates = place_instances(state.instances, self.topology)
            if (outside, duplicates) != (self.outside, self.duplicates):
                log.warning("service %s: %d passing instance(s) outside every [topology] AZ or not a "
                            "usable IP, left out; %d duplicate(s) of another instance's address:port, "
                            "served once", self.service, outside, duplicates)
                self.outside, self.duplicates = outside, duplicates
            if not by_az:
                if self.endpoints:
                    log.warning("service %s: the catalog lists no placeable instance; keeping the last %d",
                                self.service, sum(map(len, self.endpoints.values())))
                continue
            by_az = {az: sorted(hosts) for az, hosts in sorted(by_az.items())}
            if by_az != self.endpoints:
                self.endpoints = by_az
                self.changed_at = time.monotonic()
                self.on_change()


class WeightFeeds:
    """The global document and one per zone view, each by its own WeightWatcher."""

    def __init__(self, settings: ConsulSettings, zones: Sequence[str], on_change: Callable[[], None]) -> None:
        self.changed_at: float | None = None

        def changed(_doc: WeightsDoc) -> None:
            self.changed_at = time.monotonic()
            on_change()

        self.watchers: dict[str, WeightWatcher] = {GLOBAL_VIEW: WeightWatcher(settings, kv.WEIGHTS, on_change=changed)}
        for zone in zones:
            self.watchers[zone] = WeightWatcher(settings, kv.weights_name(zone), on_change=changed)
        self.hosts = WeightWatcher(settings, kv.HOSTS, on_change=changed, parse=parse_hosts,
                                   absent_is_normal=True)

    def start(self) -> None:
        for watcher in (*self.watchers.values(), self.hosts):
            watcher.start()

    def stop(self) -> None:
        for watcher in (*self.watchers.values(), self.hosts):
            watcher.stop(timeout=0.1)

    def sick(self, view: str) -> dict[str, list[str]]:
        """zone -> the sick host addresses a view demotes, worst first (none while the
        sick-hosts document is absent or expired)."""
        return sick_addresses(self.hosts.snapshot(), None if view == GLOBAL_VIEW else view)  # type: ignore[arg-type]

    def document(self, view: str) -> WeightsDoc | None:
        """The fresh document a view routes on: its own, else the global one, else None
        (equal weights). Expired documents are None (WeightWatcher.snapshot)."""
        own = self.watchers[view].snapshot() if view in self.watchers else None
        return own if own is not None else self.watchers[GLOBAL_VIEW].snapshot()

    @property
    def errors(self) -> int:
        return sum(w.errors for w in (*self.watchers.values(), self.hosts))
