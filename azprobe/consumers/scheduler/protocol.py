"""kube-scheduler's extender protocol, v1 (k8s.io/kube-scheduler/extender/v1 types.go).

The Go types have no json tags, so the keys are the Go field names:

    ExtenderArgs          {Pod, Nodes: NodeList | null, NodeNames: [string] | null}
    ExtenderFilterResult  {Nodes, NodeNames, FailedNodes, FailedAndUnresolvableNodes, Error}
    HostPriorityList      [{Host, Score}]

kube-scheduler sends `Nodes` (full Node objects) when the extender is configured with
`nodeCacheCapable: false`, `NodeNames` when true, and reads the same field back from a
filter's answer. Only what the decision needs is decoded (msgspec skips the rest of each
object without building it): the pod's name and namespace for the log, each node's name
and its two zone labels (not the label map: building 5,000 dicts costs a quarter of the
parse). The kept nodes of a filter go back as the bytes that came in, so a filter reads
the nodes as raw spans and decodes the head of each span (the members before `spec`,
`_node_head`); a prioritize answers with names only and decodes the body in one pass.

Everything from the network is bounded: the body's size (the server), the number of
nodes, the length of a name, the nesting depth. A body that is not an ExtenderArgs
raises BadRequest with a one-line message naming the field; the server answers 400.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec

from azprobe.consumers.scheduler.zones import LEGACY_ZONE_LABEL, ZONE_LABEL, NodeZones, checked_zone

MAX_NAME_CHARS = 253  # a Node name is a DNS subdomain
NODES, NAMES = "nodes", "names"
REASON_FAILOVER = "azprobe: zone {zone} is failover only (weights generation {generation})"


class BadRequest(ValueError):
    """The body is not an ExtenderArgs this extender can answer; the message says why."""


# gc=False: a Node's decoded parts hold only strings and each other, never a cycle, so the
# 5,000 of a request are not tracked by the cycle collector and trigger none of its passes.
class _ZoneLabels(msgspec.Struct, gc=False):
    zone: str = msgspec.field(name=ZONE_LABEL, default="")
    legacy: str = msgspec.field(name=LEGACY_ZONE_LABEL, default="")


class _Meta(msgspec.Struct, gc=False):
    name: str = ""
    namespace: str = ""
    labels: _ZoneLabels | None = None


class _Object(msgspec.Struct, gc=False):
    metadata: _Meta = msgspec.field(default_factory=_Meta)


class _RawNodeList(msgspec.Struct):
    items: list[msgspec.Raw] | None = None


class _NodeList(msgspec.Struct):
    items: list[_Object] | None = None


class _RawArgs(msgspec.Struct):
    Pod: _Object | None = None
    Nodes: _RawNodeList | None = None
    NodeNames: list[str] | None = None


class _Args(msgspec.Struct):
    Pod: _Object | None = None
    Nodes: _NodeList | None = None
    NodeNames: list[str] | None = None


_RAW_ARGS = msgspec.json.Decoder(_RawArgs)
_ARGS = msgspec.json.Decoder(_Args)
_NODE = msgspec.json.Decoder(_Object)
_ENCODER = msgspec.json.Encoder()
_SPEC_MEMBER = b',"spec":'
# How far _node_head looks for a Node's `spec`: a real Node's metadata is 1-3 KB (copying
# more than the head costs as much as the scan it saves); one with managedFields or large
# annotations past the last size is decoded whole.
_HEAD_BYTES = (2048, 16384)


@dataclass(frozen=True)
class Candidates:
    """The nodes of one request, in request order."""

    mode: str  # NODES or NAMES
    pod: str  # namespace/name, for the log
    names: tuple[str, ...]
    zones: tuple[str | None, ...]
    raw_nodes: tuple[msgspec.Raw, ...] = ()  # NODES mode: each node as sent


def _check_name(name: str, where: str) -> str:
    if not name:
        raise BadRequest(f"{where}: empty node name")
    if len(name) > MAX_NAME_CHARS:
        raise BadRequest(f"{where}: node name of {len(name)} chars exceeds {MAX_NAME_CHARS}")
    return name


def _decode(body: bytes, keep_nodes: bool) -> _Args | _RawArgs:
    try:
        return (_RAW_ARGS if keep_nodes else _ARGS).decode(body)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"ExtenderArgs: {exc}") from None
    except msgspec.DecodeError as exc:
        raise BadRequest(f"ExtenderArgs: not JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("ExtenderArgs: nested too deeply") from None


def _node_head(raw: msgspec.Raw) -> _Object | None:
    """A Node's members before its `spec`, decoded alone: the metadata, without scanning
    spec and status (three quarters of a Node's bytes). None when that is not certain.

    Sound for a body whose first pass proved it JSON: the cut before the first
    `,"spec":` plus `}` decodes only when the cut falls between two members of the Node
    object itself (inside a string or a nested value it leaves the text unbalanced), so
    what decodes is exactly the members the Node has before `spec`. Go's encoding/json,
    which kube-scheduler marshals with, writes metadata there, and no duplicate keys.
    Anything else (metadata after spec, no name, no cut within _HEAD_BYTES) is None, and
    the caller decodes the whole node."""
    view = memoryview(raw)
    for size in _HEAD_BYTES:
        head = bytes(view[:size])
        cut = head.find(_SPEC_MEMBER)
        if cut > 0 or size >= len(view):
            break
    if cut <= 0:
        return None
    try:
        node = _NODE.decode(head[:cut] + b"}")
    except (msgspec.DecodeError, RecursionError):
        return None
    return node if node.metadata.name else None


def _decode_node(raw: msgspec.Raw, i: int) -> _Object:
    if (node := _node_head(raw)) is not None:
        return node
    try:
        return _NODE.decode(raw)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"ExtenderArgs: Nodes.items[{i}]: {exc}") from None
    except RecursionError:
        raise BadRequest(f"ExtenderArgs: Nodes.items[{i}]: nested too deeply") from None


def parse_args(body: bytes, *, max_nodes: int, node_zones: NodeZones, keep_nodes: bool = True) -> Candidates:
    """An ExtenderArgs body -> Candidates; BadRequest naming the field otherwise. Zones of
    full Node objects are learned by `node_zones` for requests that carry names only.
    `keep_nodes`: keep each Node's bytes for the answer (a filter's), at the cost of a
    second decode of each node."""
    args = _decode(body, keep_nodes)
    pod = "?"
    if args.Pod is not None:
        meta = args.Pod.metadata
        pod = f"{meta.namespace[:64] or '-'}/{meta.name[:MAX_NAME_CHARS] or '-'}"
    if args.Nodes is not None:
        items = args.Nodes.items or []  # a Go NodeList without items: no nodes
        _check_count(len(items), "Nodes.items", max_nodes)
        raws: tuple[msgspec.Raw, ...] = ()
        objects: list[_Object]
        if isinstance(args.Nodes, _RawNodeList):
            raws = tuple(args.Nodes.items or ())
            objects = [_decode_node(raw, i) for i, raw in enumerate(raws)]
        else:
            objects = args.Nodes.items or []
        names, zones = [], []
        for i, node in enumerate(objects):
            meta = node.metadata
            names.append(_check_name(meta.name, f"Nodes.items[{i}].metadata.name"))
            labels = meta.labels
            zones.append(None if labels is None else checked_zone(labels.zone or labels.legacy))
        node_zones.learn(list(zip(names, zones)))
        return Candidates(NODES, pod, tuple(names), tuple(zones), raws)
    if args.NodeNames is not None:
        _check_count(len(args.NodeNames), "NodeNames", max_nodes)
        names = args.NodeNames
        if names and (min(map(len, names)) == 0 or max(map(len, names)) > MAX_NAME_CHARS):  # the culprit, by name
            for i, n in enumerate(names):
                _check_name(n, f"NodeNames[{i}]")
        return Candidates(NAMES, pod, tuple(names), tuple(node_zones.zones_of(names)))
    raise BadRequest("ExtenderArgs: neither Nodes.items nor NodeNames is set "
                     "(kube-scheduler sends one of them, by the extender's nodeCacheCapable)")


def _check_count(count: int, field: str, max_nodes: int) -> None:
    if count > max_nodes:
        raise BadRequest(f"ExtenderArgs: {field} lists {count} nodes, more than {max_nodes} "
                         "(raise extender.max_nodes if the cluster is that large)")


# --- answers --------------------------------------------------------------------------

def filter_result(candidates: Candidates, kept: Sequence[int], failed: Mapping[str, str]) -> bytes:
    """An ExtenderFilterResult in the request's mode. Removed nodes go to
    FailedAndUnresolvableNodes: evicting pods there would not make their zone healthy, so
    preemption must not try them. Error is always empty: kube-scheduler fails the pod on
    a filter error."""
    result: dict[str, object] = {"Nodes": None, "NodeNames": None, "FailedNodes": {},
                                 "FailedAndUnresolvableNodes": dict(failed), "Error": ""}
    if candidates.mode == NODES:
        result["Nodes"] = {"metadata": {}, "items": [candidates.raw_nodes[i] for i in kept]}
    else:
        result["NodeNames"] = [candidates.names[i] for i in kept]
    return _ENCODER.encode(result)


def priority_list(names: Sequence[str], scores: Sequence[int]) -> bytes:
    """A HostPriorityList: [{Host, Score}] in request order."""
    return _ENCODER.encode([{"Host": name, "Score": score} for name, score in zip(names, scores)])
