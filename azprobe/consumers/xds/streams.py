"""What one xDS stream has been sent and what it needs next: state of the world (SotW)
and incremental (delta). Pure: requests in, responses out, no I/O.

Memory per stream is bounded: per resource type the subscribed names (at most
`max_names`), the versions sent (at most 2 x `max_names` plus the snapshot's resources,
else the stream ends with RESOURCE_EXHAUSTED), and the last nonce; the resources themselves live in
the shared ViewSnapshot, and so does each response's serialized form: a response is the
snapshot's bytes for that selection of resources (built once, shared by every stream
that is owed the same) followed by the stream's own nonce field (EncodedResponse).
A stream is never behind by a queue of pushes: `pending(snapshot)` compares what was
sent with the latest snapshot, so a slow reader gets the latest state once it reads
again, and versions it never saw are skipped.

Protocol choices (the xDS protocol, envoyproxy.io "xDS REST and gRPC protocol"):
- a version is sent to a stream at most once: after an ACK or a NACK alike, the same
  content is not sent again; a NACK is reported (the caller logs and counts it) and the
  next change is sent as usual, so a NACKing stream gets one response per change;
- a request whose nonce is not the last one sent for its type (stale) is ignored, as the
  protocol says; a nonce this stream never issued, an unknown type URL, or too many
  names is a protocol error: the stream ends with a gRPC error, the others go on;
- delta: subscribing to a name that does not exist answers it in removed_resources
  once (the client stops waiting); subscribing to a name again resends it; unsubscribing
  forgets it (no response).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from envoy.service.discovery.v3 import discovery_pb2

from azprobe.consumers.xds import resources
from azprobe.consumers.xds.snapshot import Entry, ViewSnapshot, sotw_version
from azprobe.contracts.window import is_decimal

ABSENT = ""  # delta: the client was told the name does not exist
WILDCARD = "*"
DEFAULT_MAX_NAMES = 1024


class ProtocolError(Exception):
    """The client broke the protocol; `code` is a grpc.StatusCode name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Outcome:
    """What a request was: for logs and counters."""

    type_url: str
    nack: str | None = None  # the client's error_detail message
    stale: bool = False
    # False: the request cannot change what the stream is owed (a delta ACK or NACK
    # that subscribes to nothing new), so no write needs to look.
    may_owe: bool = True


NONCE_TAG = b"\x2a"  # field 5 (nonce), length-delimited, in DiscoveryResponse and DeltaDiscoveryResponse


class EncodedResponse:
    """One response for one stream: the shared serialized body (everything but the
    nonce) and this stream's nonce. A field appended to a serialized message is parsed
    as part of it (protobuf encoding), so `wire()` is the full response."""

    __slots__ = ("type_url", "nonce", "body", "message_type")

    def __init__(self, type_url: str, nonce: str, body: bytes, message_type: Any) -> None:
        self.type_url, self.nonce, self.body, self.message_type = type_url, nonce, body, message_type

    def wire(self) -> bytes:
        nonce = self.nonce.encode()
        return self.body + NONCE_TAG + bytes((len(nonce),)) + nonce  # a nonce is at most 19 digits

    def decode(self) -> Any:
        return self.message_type.FromString(self.wire())


def _body(build: Callable[[], Any]) -> Callable[[], bytes]:
    return lambda: build().SerializeToString(deterministic=True)


def short_type(type_url: str) -> str:
    return type_url.rsplit(".", 1)[-1]


class _Nonces:
    __slots__ = ("issued",)

    def __init__(self) -> None:
        self.issued = 0

    def next(self) -> str:
        self.issued += 1
        return str(self.issued)

    def check(self, nonce: str) -> None:
        if nonce and not (is_decimal(nonce, 19) and 0 < int(nonce) <= self.issued):
            raise ProtocolError("INVALID_ARGUMENT", f"response_nonce {nonce[:40]!r} was never sent on this stream")


def _check_type(type_url: str, allowed: Collection[str]) -> None:
    if type_url not in allowed:
        raise ProtocolError("INVALID_ARGUMENT", f"unknown type_url {type_url[:200]!r}; this server serves "
                                                + ", ".join(sorted(allowed)))


def _check_names(count: int, max_names: int, type_url: str) -> None:
    if count > max_names:
        raise ProtocolError("RESOURCE_EXHAUSTED", f"{count} resource names of {short_type(type_url)} on one stream: "
                                                  f"over the limit of {max_names}")


# --- state of the world -------------------------------------------------------------

@dataclass(slots=True)
class _SotwType:
    names: frozenset[str] | None  # None: wildcard
    nonce: str = ""
    sent_version: str | None = None
    sent_names: frozenset[str] | None = None


@dataclass(slots=True)
class SotwStream:
    allowed_types: Collection[str]
    max_names: int = DEFAULT_MAX_NAMES
    types: dict[str, _SotwType] = field(default_factory=dict)
    _nonces: _Nonces = field(default_factory=_Nonces)

    def on_request(self, req: discovery_pb2.DiscoveryRequest) -> Outcome:
        _check_type(req.type_url, self.allowed_types)
        _check_names(len(req.resource_names), self.max_names, req.type_url)
        self._nonces.check(req.response_nonce)
        state = self.types.get(req.type_url)
        if state is not None and req.response_nonce and req.response_nonce != state.nonce:
            return Outcome(req.type_url, stale=True)
        names = frozenset(req.resource_names)
        if req.type_url in resources.WILDCARD_TYPES and (not names or WILDCARD in names):
            wanted: frozenset[str] | None = None
        else:
            wanted = names - {WILDCARD}
        if state is None:
            self.types[req.type_url] = _SotwType(names=wanted)
        else:
            state.names = wanted
        if req.response_nonce and req.HasField("error_detail"):
            return Outcome(req.type_url, nack=req.error_detail.message or "(no message)")
        return Outcome(req.type_url)

    def pending(self, snapshot: ViewSnapshot) -> list[EncodedResponse]:
        out = []
        for type_url, state in self.types.items():
            available = snapshot.entries(type_url)
            chosen: list[Entry] = ([available[n] for n in sorted(available)] if state.names is None
                                   else [available[n] for n in sorted(state.names) if n in available])
            version = sotw_version(chosen)
            if version == state.sent_version and state.names == state.sent_names:
                continue
            state.nonce = self._nonces.next()
            state.sent_version, state.sent_names = version, state.names
            body = snapshot.encoded(("sotw", type_url, tuple(e.name for e in chosen)), _body(
                lambda: discovery_pb2.DiscoveryResponse(version_info=version, type_url=type_url,
                                                        resources=[e.resource for e in chosen])))
            out.append(EncodedResponse(type_url, state.nonce, body, discovery_pb2.DiscoveryResponse))
        return out


# --- delta --------------------------------------------------------------------------

@dataclass(slots=True)
class _DeltaType:
    wildcard: bool
    names: set[str] = field(default_factory=set)
    sent: dict[str, str] = field(default_factory=dict)  # name -> version the client has (ABSENT: told missing)
    nonce: str = ""
    known: int = 0  # resources of this type in the last snapshot looked at (bounds `sent`)


@dataclass(slots=True)
class DeltaStream:
    allowed_types: Collection[str]
    max_names: int = DEFAULT_MAX_NAMES
    types: dict[str, _DeltaType] = field(default_factory=dict)
    _nonces: _Nonces = field(default_factory=_Nonces)

    def on_request(self, req: discovery_pb2.DeltaDiscoveryRequest) -> Outcome:
        _check_type(req.type_url, self.allowed_types)
        _check_names(len(req.resource_names_subscribe) + len(req.resource_names_unsubscribe)
                     + len(req.initial_resource_versions), self.max_names, req.type_url)
        self._nonces.check(req.response_nonce)
        state = self.types.get(req.type_url)
        if state is not None and req.response_nonce and req.response_nonce != state.nonce:
            return Outcome(req.type_url, stale=True, may_owe=False)
        subscribe = set(req.resource_names_subscribe)
        may_owe = state is None or bool(subscribe) or bool(req.resource_names_unsubscribe)
        if state is None:
            # A first request without names subscribes to everything for the wildcard
            # types (the protocol's legacy wildcard); for the others it asks for nothing.
            state = _DeltaType(wildcard=req.type_url in resources.WILDCARD_TYPES and not subscribe)
            state.sent.update({n: v for n, v in req.initial_resource_versions.items()})
            self.types[req.type_url] = state
        if WILDCARD in subscribe:
            state.wildcard = True
        for name in subscribe - {WILDCARD}:
            state.names.add(name)
            state.sent.pop(name, None)  # (re)subscribing asks for the resource again
        for name in req.resource_names_unsubscribe:
            if name == WILDCARD:
                state.wildcard = False
                for held in [n for n in state.sent if n not in state.names]:
                    del state.sent[held]
            else:
                state.names.discard(name)
                # Under a wildcard the client still gets a resource that exists, so its
                # version stays; a name it was told is absent is of no use any more, and
                # keeping it would let a client grow this dict by subscribing to and
                # unsubscribing from invented names, max_names at a time.
                if not state.wildcard or state.sent.get(name) == ABSENT:
                    state.sent.pop(name, None)
        _check_names(len(state.names), self.max_names, req.type_url)
        # What may be in `sent`: the names subscribed (max_names), the versions claimed in
        # the first request (max_names), and the resources of the last snapshot sent. More
        # is a leak this bound turns into the end of one stream, not the server's memory.
        if len(state.sent) > 2 * self.max_names + state.known:
            raise ProtocolError("RESOURCE_EXHAUSTED", f"{len(state.sent)} resources of {short_type(req.type_url)} "
                                                      f"tracked on one stream: over the limit of "
                                                      f"{2 * self.max_names + state.known}")
        if req.response_nonce and req.HasField("error_detail"):
            return Outcome(req.type_url, nack=req.error_detail.message or "(no message)", may_owe=may_owe)
        return Outcome(req.type_url, may_owe=may_owe)

    def pending(self, snapshot: ViewSnapshot) -> list[EncodedResponse]:
        out = []
        for type_url, state in self.types.items():
            available = snapshot.entries(type_url)
            state.known = len(available)
            wanted = set(available) | state.names if state.wildcard else state.names
            send = [available[n] for n in sorted(wanted) if n in available and state.sent.get(n) != available[n].version]
            removed = sorted(n for n in wanted if n not in available and state.sent.get(n) != ABSENT)
            if state.wildcard:  # gone from the snapshot, and the client has it
                removed += sorted(n for n, v in state.sent.items()
                                  if n not in available and n not in state.names and v != ABSENT)
            if not send and not removed:
                continue
            for e in send:
                state.sent[e.name] = e.version
            for n in removed:
                if n in state.names:
                    state.sent[n] = ABSENT
                else:
                    state.sent.pop(n, None)
            state.nonce = self._nonces.next()
            body = snapshot.encoded(("delta", type_url, tuple(e.name for e in send), tuple(removed)), _body(
                lambda: discovery_pb2.DeltaDiscoveryResponse(
                    type_url=type_url, system_version_info=snapshot.system_version, removed_resources=removed,
                    resources=[e.wrapped for e in send])))
            out.append(EncodedResponse(type_url, state.nonce, body, discovery_pb2.DeltaDiscoveryResponse))
        return out
