"""The resources one view serves, each with a version that is a digest of its bytes.

A ViewSnapshot is immutable and shared by every stream of its view: a stream keeps a
reference to the latest one and the versions it has sent, never a copy or a queue.
Listener, RouteConfiguration and Cluster are the same in every view (built once and
shared); the ClusterLoadAssignments differ by the view's weights document.

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf.any_pb2 import Any

from azprobe.consumers.localities import Endpoint, plan_localities
from azprobe.consumers.xds import resources
from azprobe.contracts.weights import WeightsDoc

VERSION_CHARS = 16
MAX_ENCODED = 256  # distinct serialized responses kept per snapshot (in practice a handful)
# ... and their bytes: a delta client cycling invented names is owed a response of its own
# each time, 256 of which came to ~44 MiB
MAX_ENCODED_BYTES = 8 << 20
EQUAL_PREFIX = "equal-"  # in system_version_info: no usable document, equal weights


@dataclass(frozen=True)
class Entry:
    name: str
    version: str  # digest of the serialized resource
    resource: Any  # packed, ready for the wire
    wrapped: discovery_pb2.Resource  # the same in a delta response's envelope, built once per version


@dataclass(frozen=True)
class ViewSnapshot:
    view: str
    by_type: Mapping[str, Mapping[str, Entry]]
    weights_generation: int | None  # None: equal weights
    system_version: str = field(default="")
    # serialized responses built from this snapshot, by what they hold: every stream owed
    # the same resources gets the same bytes
    _encoded: dict[Hashable, bytes] = field(default_factory=dict, compare=False, repr=False)

    def entries(self, type_url: str) -> Mapping[str, Entry]:
        return self.by_type.get(type_url, {})

    def encoded(self, key: Hashable, build: Callable[[], bytes]) -> bytes:
        """The bytes for `key`, built once (the key must name everything they depend on
        beyond this snapshot)."""
        body = self._encoded.get(key)
        if body is None:
            body = build()
            held = sum(map(len, self._encoded.values()))
            if len(self._encoded) >= MAX_ENCODED or held + len(body) > MAX_ENCODED_BYTES:
                self._encoded.clear()
            self._encoded[key] = body
        return body


def digest(parts: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(4, "big"))
        h.update(part)
    return h.hexdigest()[:VERSION_CHARS]


def entry(name: str, message: object) -> Entry:
    packed = Any()
    packed.Pack(message, deterministic=True)  # type: ignore[arg-type]
    version = digest([packed.value])
    return Entry(name=name, version=version, resource=packed,
                 wrapped=discovery_pb2.Resource(name=name, version=version, resource=packed))


def sotw_version(entries: Sequence[Entry]) -> str:
    """version_info of a state-of-the-world response: a digest of its resources."""
    return digest(f"{e.name}\0{e.version}".encode() for e in sorted(entries, key=lambda e: e.name))


def chain_entries(services: Iterable[str]) -> dict[str, dict[str, Entry]]:
    """Listener, RouteConfiguration and Cluster of every service (shared by all views)."""
    names = sorted(services)
    return {resources.LISTENER: {n: entry(n, resources.listener(n)) for n in names},
            resources.ROUTE: {n: entry(n, resources.route_configuration(n)) for n in names},
            resources.CLUSTER: {n: entry(n, resources.cluster(n)) for n in names}}


def build_snapshot(view: str, endpoints: Mapping[str, Mapping[str, Sequence[Endpoint]]],
                   weights: WeightsDoc | None, chain: Mapping[str, Mapping[str, Entry]],
                   sick: Mapping[str, Sequence[str]] | None = None) -> ViewSnapshot:
    """`endpoints`: service -> AZ -> endpoints; `sick`: zone -> sick host addresses, worst
    first. A service without any endpoint has no assignment at all (never an empty one):
    its clients keep what they have."""
    assignments: dict[str, Entry] = {}
    for service, by_az in sorted(endpoints.items()):
        if not any(by_az.values()):
            continue
        plan = plan_localities(by_az, weights, sick)
        assignments[service] = entry(service, resources.cluster_load_assignment(service, plan))
    by_type = dict(chain)
    by_type[resources.ENDPOINT] = assignments
    version = sotw_version([e for t in resources.TYPES for e in by_type.get(t, {}).values()])
    system = version if weights is not None else EQUAL_PREFIX + version
    return ViewSnapshot(view=view, by_type=by_type, weights_generation=None if weights is None else weights.generation,
                    system_version=system)
