"""Consul's HTTP API over the devconsul server: same paths, query parameters, headers,
status codes and plain-text error bodies as Consul's agent/*_endpoint.go, so py-consul
(or curl) cannot tell the difference for the endpoints implemented here.

Limits, at Consul's defaults (tests trust devconsul to refuse what Consul refuses):
- a txn body: at most max(txn_max_req_len, kv_max_value_size) = 512 KB, counted as it
  arrives, so a chunked body (no Content-Length) is cut at the cap too, with Consul's
  413 "Request body too large, max size: ..." (its http.MaxBytesReader);
- a KV value (PUT /v1/kv, a txn op): kv_max_value_size, 512 KB. Consul checks a PUT's
  Content-Length only; devconsul also counts a chunked value, with the same 413;
- at most 128 operations per txn (Consul >= 1.14);
- what a txn returns: Consul sets no bound (128 gets of 512 KB values answer ~90 MB).
  devconsul bounds the Values of a txn's results at the same 512 KB as its request, so
  a transaction moves at most 512 KB of values either way; the op whose results cross
  it fails the transaction as any failing op does (409, Errors at its OpIndex, nothing
  applied). One maximal value still reads in one txn; more take separate GETs;
- connections per client IP: limits.http_max_conns_per_client (connlimit.py);
- any other request body: BODY_MAX_BYTES, and every body within BODY_READ_TIMEOUT_S.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from azprobe.contracts import bounded_json
from azprobe.contracts.kv import MAX_VALUE_BYTES
from azprobe.contracts.window import is_decimal
from azprobe.dev.devconsul.acl import AclNotFound, Identity, permission_denied
from azprobe.dev.devconsul.blocking import query_timeout
from azprobe.dev.devconsul.durations import parse_go_duration_ns
from azprobe.dev.devconsul.server import VERSION, DevConsulServer
from azprobe.dev.devconsul.store import (DEFAULT_LOCK_DELAY_NS, SESSION_TTL_MAX_NS, SESSION_TTL_MIN_NS,
                                     StoreError)

KV_MAX_VALUE_SIZE = MAX_VALUE_BYTES  # Consul's kv_max_value_size default (raft's suggested max)
TXN_MAX_REQ_LEN = 512 * 1024  # Consul's txn_max_req_len default
TXN_MAX_LEN = max(TXN_MAX_REQ_LEN, KV_MAX_VALUE_SIZE)  # Consul's rule for the txn body cap
BODY_MAX_BYTES = 4 * 1024 * 1024  # every other request body (Consul sets none)
MAX_TXN_OPS = 128
LOCK_DELAY_MIN_THRESHOLD_NS = 1000  # Consul: lock delays below this are seconds, not ns
MAX_LOCK_DELAY_NS = 60 * 1_000_000_000  # Consul's structs.MaxLockDelay: longer ones are clamped to it
BODY_READ_TIMEOUT_S = 10.0  # a request body that has not arrived by then is a 408, not a parked handler

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SERVER_KEY = web.AppKey("devconsul", DevConsulServer)


class HTTPError(Exception):
    """An error answered as Consul does: a status and a short plain-text body."""

    def __init__(self, status: int, reason: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.headers = headers or {}


# ------------------------------------------------------------------ small helpers

def _dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"))


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(text=_dumps(data), status=status, content_type="application/json", headers=headers)


def _text(status: int, body: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(text=body, status=status, content_type="text/plain", headers=headers)


def _field(obj: dict[str, Any], name: str, default: Any = None) -> Any:
    """Go's encoding/json (and Consul's mapstructure decoding) match field names case-
    insensitively, and py-consul sends lowercase ("ttl", "lockdelay"): do the same."""
    want = name.lower().replace("_", "")
    for key, value in obj.items():
        if key.lower().replace("_", "") == want:
            return value
    return default


def _server(request: web.Request) -> DevConsulServer:
    return request.app[SERVER_KEY]


def _identity(request: web.Request) -> Identity:
    try:
        return _server(request).acl.resolve(request)
    except AclNotFound:
        raise HTTPError(403, "ACL not found") from None


def _methods(request: web.Request, *allowed: str) -> None:
    if request.method not in allowed:
        raise HTTPError(405, f"method {request.method} not allowed", {"Allow": ",".join(allowed)})


def _check_dc(request: web.Request) -> None:
    dc = request.query.get("dc")
    if dc and dc != _server(request).datacenter:
        raise HTTPError(500, "No path to datacenter")


def _parse_uint(text: str) -> int:
    # Consul hands strconv's error straight back as a 500
    if not is_decimal(text) or int(text) >= 2**64:
        raise HTTPError(500, f'strconv.ParseUint: parsing "{text}": invalid syntax')
    return int(text)


def _body_too_large(limit: int, length: int | None = None, see: str = "") -> str:
    """Consul's 413 text: with the Content-Length when the client sent one, without when
    the body was cut while it arrived."""
    size = f"({length} bytes)" if length is not None else ""
    return f"Request body{size} too large, max size: {limit} bytes." + (
        f" See https://developer.hashicorp.com/docs/agent/config/config-files#{see}." if see else "")


async def _read_body(request: web.Request, limit: int = BODY_MAX_BYTES, see: str = "") -> bytes:
    """The request body, at most `limit` bytes counted as they arrive (a chunked body has
    no Content-Length to check first) and within BODY_READ_TIMEOUT_S: a client that
    sends headers and then trickles (or never sends) its body must not hold a handler
    for ever. Over the limit: 413 with Consul's text (`see`: its config-files anchor)."""
    length = request.content_length
    if length is not None and length > limit:
        raise HTTPError(413, _body_too_large(limit, length, see))

    async def bounded() -> bytes:
        chunks: list[bytes] = []
        size = 0
        while chunk := await request.content.read(64 * 1024):
            size += len(chunk)
            if size > limit:
                raise HTTPError(413, _body_too_large(limit, see=see))
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(bounded(), BODY_READ_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise HTTPError(408, f"Request body not received within {BODY_READ_TIMEOUT_S:g}s") from None


async def _json_body(request: web.Request, prefix: str = "Request decode failed", limit: int = BODY_MAX_BYTES,
                     see: str = "") -> Any:
    raw = await _read_body(request, limit, see)
    if not raw.strip():
        return None
    try:
        return bounded_json.loads(raw, max_bytes=limit, what="request body")
    except bounded_json.JsonRefused as exc:
        raise HTTPError(400, f"{prefix}: {exc}") from None


async def _json_object_body(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, or Consul's 400 for anything else."""
    body = await _json_body(request)
    if not isinstance(body, dict):
        raise HTTPError(400, "Request decode failed: expected a JSON object")
    return body


def _query_meta(request: web.Request, index: int, filtered: bool = False) -> dict[str, str]:
    headers = {"X-Consul-Index": str(max(index, 1)), "X-Consul-KnownLeader": "true",
               "X-Consul-LastContact": "0", "X-Consul-Effective-Consistency": "leader",
               "X-Consul-Default-Acl-Policy": _server(request).acl.default_policy}
    if filtered:
        headers["X-Consul-Results-Filtered-By-ACLs"] = "true"
    return headers


Compute = Callable[[], tuple[int, Any, tuple[str, str | None, bool]]]


async def _blocking(request: web.Request, compute: Compute) -> tuple[int, Any]:
    """Consul's blockingQuery: answer at once without `index`; otherwise hold until the
    watched index exceeds it or wait (+ jitter) runs out. compute() returns (index,
    payload, (table, kv prefix, any_key)) and is re-run on every relevant commit."""
    query = request.query
    min_index = 0
    wait_s: float | None = None
    if query.get("wait"):
        try:
            wait_s = parse_go_duration_ns(query["wait"]) / 1e9
        except ValueError:
            raise HTTPError(400, "Invalid wait time") from None
    if query.get("index"):
        text = query["index"]
        if not is_decimal(text):
            raise HTTPError(400, "Invalid index")
        min_index = int(text)
    server = _server(request)
    loop = asyncio.get_running_loop().time
    deadline = loop() + query_timeout(wait_s) if min_index > 0 else 0.0
    while True:
        index, payload, (table, prefix, any_key) = compute()
        index = max(index, 1)  # Consul never hands out 0: a client would spin
        if min_index == 0 or index > min_index:
            return index, payload
        waiter = server.waiters.add(table, prefix, any_key)
        if not await server.waiters.wait(waiter, deadline - loop()):
            index, payload, _ = compute()
            return max(index, 1), payload


# ------------------------------------------------------------------ KV

def _kv_out(entry: dict[str, Any]) -> dict[str, Any]:
    """DirEntry's JSON: Value base64 (null when empty), Session omitted when unset."""
    out: dict[str, Any] = {"LockIndex": entry["LockIndex"], "Key": entry["Key"], "Flags": entry["Flags"],
                           "Value": base64.b64encode(entry["Value"]).decode() if entry["Value"] else None}
    if entry.get("Session"):
        out["Session"] = entry["Session"]
    out["CreateIndex"] = entry["CreateIndex"]
    out["ModifyIndex"] = entry["ModifyIndex"]
    return out


def _conflicting(request: web.Request, *flags: str) -> None:
    if sum(1 for f in flags if f in request.query) > 1:
        raise HTTPError(400, f"Conflicting flags: {urlencode(sorted(request.query.items()))}\n")


async def kv_endpoint(request: web.Request) -> web.StreamResponse:
    _methods(request, "GET", "PUT", "DELETE")
    _check_dc(request)
    key = request.match_info["key"]
    if request.method == "GET":
        if "keys" in request.query:
            return await _kv_get_keys(request, key)
        return await _kv_get(request, key)
    if request.method == "PUT":
        return await _kv_put(request, key)
    return await _kv_delete(request, key)


async def _kv_get(request: web.Request, key: str) -> web.StreamResponse:
    store = _server(request).store
    identity = _identity(request)
    if "recurse" in request.query:
        allowed = _server(request).acl.allowed(identity)
        filtered = False

        def compute_list() -> tuple[int, Any, tuple[str, str | None, bool]]:
            nonlocal filtered
            idx, entries = store.kv_list(key)
            if not allowed:  # Consul filters lists by ACL rather than refusing them
                filtered, entries = bool(entries), []
            return idx, entries, ("kvs", key, not entries or key == "")

        index, entries = await _blocking(request, compute_list)
        headers = _query_meta(request, index, filtered)
        if not entries:
            return web.Response(status=404, headers=headers)
        return _json([_kv_out(e) for e in entries], headers=headers)
    if key == "":
        raise HTTPError(400, "Missing key name")
    if not _server(request).acl.allowed(identity):
        raise HTTPError(403, permission_denied("key:read", key))

    def compute_one() -> tuple[int, Any, tuple[str, str | None, bool]]:
        idx, entry = store.kv_get(key)
        return idx, entry, ("kvs", key, entry is None)

    index, entry = await _blocking(request, compute_one)
    headers = _query_meta(request, index)
    if entry is None:
        return web.Response(status=404, headers=headers)
    if "raw" in request.query:
        headers.update({"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox"})
        return web.Response(body=entry["Value"], content_type="text/plain", headers=headers)
    return web.Response(body=_entry_body(request, entry), headers=headers, content_type="application/json")


_BODY_CACHE = web.AppKey("kv_body_cache", dict)


def _entry_body(request: web.Request, entry: dict[str, Any]) -> bytes:
    """JSON for a single-key GET, encoded once per entry version: when a write wakes 500
    watchers of one key they all get the same bytes. Store entries are replaced, never
    mutated, so identity tells whether the cached body is current."""
    cache = request.app[_BODY_CACHE]
    hit = cache.get(entry["Key"])
    if hit is not None and hit[0] is entry:
        return hit[1]
    body = _dumps([_kv_out(entry)]).encode()
    if len(cache) > 1024:
        cache.clear()
    cache[entry["Key"]] = (entry, body)
    return body


async def _kv_get_keys(request: web.Request, prefix: str) -> web.StreamResponse:
    store = _server(request).store
    allowed = _server(request).acl.allowed(_identity(request))
    sep = request.query.get("separator", request.query.get("seperator", ""))  # Consul accepts both spellings
    filtered = False

    def compute() -> tuple[int, Any, tuple[str, str | None, bool]]:
        nonlocal filtered
        idx, keys, _ = store.kv_keys(prefix, sep)
        if not allowed:
            filtered, keys = bool(keys), []
        return idx, keys, ("kvs", prefix, not keys or prefix == "")

    index, keys = await _blocking(request, compute)
    headers = _query_meta(request, index, filtered)
    if not keys and prefix != "":
        return web.Response(status=404, headers=headers)
    return _json(keys, headers=headers)


async def _kv_put(request: web.Request, key: str) -> web.StreamResponse:
    server = _server(request)
    if key == "":
        raise HTTPError(400, "Missing key name")
    _conflicting(request, "cas", "acquire", "release")
    query = request.query
    if not server.acl.allowed(_identity(request)):
        raise HTTPError(403, permission_denied("key:write", key))
    flags = _parse_uint(query["flags"]) if "flags" in query else 0
    op, cas, session = "set", 0, ""
    if "cas" in query:
        op, cas = "cas", _parse_uint(query["cas"])
    if "acquire" in query:
        op, session = "lock", query["acquire"]
    if "release" in query:
        op, session = "unlock", query["release"]
    value = await _read_body(request, KV_MAX_VALUE_SIZE, "kv_max_value_size")
    try:
        ok, commit = server.store.kv_apply(op, key, value, flags, cas, session, now=time.monotonic())
    except StoreError as exc:
        raise HTTPError(500, str(exc)) from None
    server.commit(commit)
    return _json(True if op == "set" else ok)


async def _kv_delete(request: web.Request, key: str) -> web.StreamResponse:
    server = _server(request)
    _conflicting(request, "recurse", "cas")
    op = "delete-tree" if "recurse" in request.query else "delete"
    if op == "delete" and key == "":
        raise HTTPError(400, "Missing key name")
    cas = 0
    if "cas" in request.query:
        op, cas = "delete-cas", _parse_uint(request.query["cas"])
    if not server.acl.allowed(_identity(request)):
        raise HTTPError(403, permission_denied("key:write", key))
    ok, commit = server.store.kv_apply(op, key, cas=cas, now=time.monotonic())
    server.commit(commit)
    return _json(ok if op == "delete-cas" else True)


# ------------------------------------------------------------------ txn

_KV_VERBS = {"set", "cas", "lock", "unlock", "get", "get-tree", "check-index", "check-session",
             "check-not-exists", "delete", "delete-tree", "delete-cas"}
_KV_WRITE_VERBS = {"set", "cas", "lock", "unlock", "delete", "delete-tree", "delete-cas"}


def _txn_kv_op(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise HTTPError(400, f"Failed to parse body: unexpected raw KV type: {type(raw).__name__}")
    value = _field(raw, "Value")
    if value is None:
        data = b""
    elif isinstance(value, str):
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise HTTPError(400, f"Failed to parse body: failed to decode value: {exc}") from None
    else:
        raise HTTPError(400, f"Failed to parse body: unexpected value type: {type(value).__name__}")
    op = {"Verb": _field(raw, "Verb", ""), "Key": _field(raw, "Key", ""), "Value": data,
          "Flags": _field(raw, "Flags", 0) or 0, "Index": _field(raw, "Index", 0) or 0,
          "Session": _field(raw, "Session", "") or ""}
    if not isinstance(op["Key"], str) or not isinstance(op["Verb"], str) or not isinstance(op["Session"], str) \
            or not isinstance(op["Flags"], int) or not isinstance(op["Index"], int) \
            or op["Flags"] < 0 or op["Index"] < 0:
        raise HTTPError(400, "Failed to parse body: json: cannot unmarshal a KV operation field into its Go type")
    if len(data) > KV_MAX_VALUE_SIZE:
        raise HTTPError(413, f'Value for key "{op["Key"]}" is too large ({len(data)} > {KV_MAX_VALUE_SIZE} bytes)')
    return op


async def txn_endpoint(request: web.Request) -> web.StreamResponse:
    _methods(request, "PUT")
    _check_dc(request)
    server = _server(request)
    body = await _json_body(request, "Failed to parse body", TXN_MAX_LEN, "txn_max_req_len")
    if body is None:
        body = []
    if not isinstance(body, list):
        raise HTTPError(400, "Failed to parse body: json: cannot unmarshal object into Go value of type api.TxnOps")
    if len(body) > MAX_TXN_OPS:
        raise HTTPError(413, f"Transaction contains too many operations ({len(body)} > {MAX_TXN_OPS})")
    ops = []
    for i, item in enumerate(body):
        kv = _field(item, "KV") if isinstance(item, dict) else None
        if kv is None:
            return _json({"Results": None, "Errors": [{"OpIndex": i, "What":
                          "devconsul supports only KV operations in a transaction"}]}, status=409)
        ops.append(_txn_kv_op(kv))
    identity = _identity(request)
    errors = []
    for i, op in enumerate(ops):
        if op["Verb"] not in _KV_VERBS:
            errors.append({"OpIndex": i, "What": f'unknown KV verb "{op["Verb"]}"'})
        elif not server.acl.allowed(identity):
            perm = "key:write" if op["Verb"] in _KV_WRITE_VERBS else "key:read"
            errors.append({"OpIndex": i, "What": permission_denied(perm, op["Key"])})
    writes = any(op["Verb"] in _KV_WRITE_VERBS for op in ops)
    read_headers = {"X-Consul-KnownLeader": "true", "X-Consul-LastContact": "0"} if not writes else None
    if errors:
        return _json({"Results": None, "Errors": errors}, status=409, headers=read_headers)
    outcome = server.store.txn(ops, now=time.monotonic(), max_result_bytes=TXN_MAX_LEN)
    server.commit(outcome.commit)
    if outcome.errors:
        return _json({"Results": None, "Errors": outcome.errors}, status=409, headers=read_headers)
    results = [{"KV": _kv_out(r["KV"])} for r in outcome.results or []]
    return _json({"Results": results, "Errors": None}, headers=read_headers)


# ------------------------------------------------------------------ sessions

def _session_out(session: dict[str, Any]) -> dict[str, Any]:
    return dict(session)


def _require_write(request: web.Request, permission: str, resource: str) -> None:
    if not _server(request).acl.allowed(_identity(request)):
        raise HTTPError(403, permission_denied(permission, resource))


def _parse_lock_delay(raw: Any) -> int:
    """Consul's fixupLockDelay: "15s" or a number; values under 1000 mean seconds."""
    if isinstance(raw, str):
        try:
            ns = parse_go_duration_ns(raw)
        except ValueError as exc:
            raise HTTPError(400, f"Request decode failed: {exc}") from None
    elif isinstance(raw, (int, float)) and not isinstance(raw, bool) and math.isfinite(raw) and abs(raw) < 2**63:
        ns = int(raw)
    else:
        raise HTTPError(400, "Request decode failed: LockDelay must be a duration string or a number")
    if ns < 0:
        raise HTTPError(400, "Request decode failed: LockDelay must not be negative")
    ns = ns * 1_000_000_000 if ns < LOCK_DELAY_MIN_THRESHOLD_NS else ns
    return min(ns, MAX_LOCK_DELAY_NS)  # Consul clamps to structs.MaxLockDelay (60 s)


async def session_create(request: web.Request) -> web.StreamResponse:
    _methods(request, "PUT")
    _check_dc(request)
    server = _server(request)
    body = await _json_body(request) or {}
    if not isinstance(body, dict):
        raise HTTPError(400, "Request decode failed: json: cannot unmarshal into Go value of type structs.Session")
    node = _field(body, "Node") or server.node_name
    _require_write(request, "session:write", node)
    lock_delay = _field(body, "LockDelay")
    lock_delay_ns = DEFAULT_LOCK_DELAY_NS if lock_delay is None else _parse_lock_delay(lock_delay)
    ttl = _field(body, "TTL") or ""
    if not isinstance(ttl, str):
        raise HTTPError(400, "Request decode failed: TTL must be a duration string")
    if ttl:
        try:
            ttl_ns = parse_go_duration_ns(ttl)
        except ValueError as exc:  # a decode error: Consul's 400, as for any bad duration
            raise HTTPError(400, f"Request decode failed: Session TTL '{ttl[:64]}' invalid: {exc}") from None
        if ttl_ns != 0 and not SESSION_TTL_MIN_NS <= ttl_ns <= SESSION_TTL_MAX_NS:
            raise HTTPError(500, f"Invalid Session TTL '{ttl_ns}', must be between [10s=24h0m0s]")
    checks = _field(body, "NodeChecks")
    if checks is None:
        checks = _field(body, "Checks")
    try:
        sid, commit = server.store.session_create(
            node=node, name=_field(body, "Name") or "", behavior=_field(body, "Behavior") or "release",
            ttl=ttl, lock_delay_ns=lock_delay_ns, checks=checks)
    except StoreError as exc:
        raise HTTPError(500, str(exc)) from None
    server.commit(commit)
    return _json({"ID": sid})


async def session_destroy(request: web.Request) -> web.StreamResponse:
    _methods(request, "PUT")
    _check_dc(request)
    server = _server(request)
    sid = request.match_info["id"]
    session = server.store.session_get(sid)
    _require_write(request, "session:write", session["Node"] if session else sid)
    server.commit(server.store.session_destroy(sid, now=time.monotonic()))
    return _json(True)


async def session_renew(request: web.Request) -> web.StreamResponse:
    _methods(request, "PUT")
    _check_dc(request)
    server = _server(request)
    sid = request.match_info["id"]
    session = server.store.session_get(sid)
    _require_write(request, "session:write", session["Node"] if session else sid)
    if session is None:
        raise HTTPError(404, f"Session id '{sid}' not found")
    server.reset_session_timer(sid)
    return _json([_session_out(session)])


async def _session_query(request: web.Request, select: Callable[[], tuple[int, list[dict[str, Any]]]]
                         ) -> web.StreamResponse:
    _methods(request, "GET")
    _check_dc(request)
    allowed = _server(request).acl.allowed(_identity(request))

    def compute() -> tuple[int, Any, tuple[str, str | None, bool]]:
        idx, sessions = select()
        return idx, sessions if allowed else [], ("sessions", None, True)

    index, sessions = await _blocking(request, compute)
    return _json([_session_out(s) for s in sessions], headers=_query_meta(request, index, bool(sessions) and not allowed))


async def session_info(request: web.Request) -> web.StreamResponse:
    store = _server(request).store
    sid = request.match_info["id"]

    def select() -> tuple[int, list[dict[str, Any]]]:
        session = store.session_get(sid)
        return store.table_index["sessions"], [session] if session else []

    return await _session_query(request, select)


async def session_list(request: web.Request) -> web.StreamResponse:
    store = _server(request).store
    return await _session_query(request, lambda: store.session_list())


async def session_node(request: web.Request) -> web.StreamResponse:
    store = _server(request).store
    node = request.match_info["node"]
    return await _session_query(request, lambda: store.session_list(node))


# ------------------------------------------------------------------ status / agent

async def status_leader(request: web.Request) -> web.StreamResponse:
    _methods(request, "GET")
    return _json(_server(request).leader_addr)


async def status_peers(request: web.Request) -> web.StreamResponse:
    _methods(request, "GET")
    return _json([_server(request).leader_addr])


async def agent_self(request: web.Request) -> web.StreamResponse:
    _methods(request, "GET")
    server = _server(request)
    _require_write(request, "agent:read", server.node_name)
    return _json({
        "Config": {"Datacenter": server.datacenter, "PrimaryDatacenter": server.datacenter,
                   "NodeName": server.node_name, "NodeID": server.node_id, "Revision": "devconsul",
                   "Server": True, "Version": VERSION, "BuildDate": "2026-01-01T00:00:00Z",
                   "SegmentName": "", "VersionMetadata": "", "VersionPrerelease": ""},
        "Member": {"Name": server.node_name, "Addr": server.advertise_addr, "Port": 8301,
                   "Tags": {"role": "consul", "dc": server.datacenter, "build": VERSION, "port": "8300",
                            "id": server.node_id, "bootstrap": "1"},
                   "Status": 1, "ProtocolMin": 1, "ProtocolMax": 5, "ProtocolCur": 2,
                   "DelegateMin": 2, "DelegateMax": 5, "DelegateCur": 4},
        "Meta": {"consul-network-segment": ""},
        # the fields Consul's clients read (consul members/info, Vault, Nomad, py-consul users)
        "Stats": {
            "agent": {"check_monitors": "0", "check_ttls": "0", "checks": "0", "services": "0"},
            "build": {"prerelease": "", "revision": "devconsul", "version": VERSION},
            "consul": {"acl": "enabled" if server.acl.enabled else "disabled", "bootstrap": "true",
                       "known_datacenters": "1", "leader": "true", "leader_addr": server.leader_addr,
                       "server": "true"},
            "raft": {"state": "Leader", "num_peers": "0", "applied_index": str(server.store.index),
                     "commit_index": str(server.store.index), "last_log_index": str(server.store.index)},
            "runtime": {"arch": "amd64", "os": "linux", "cpu_count": str(os.cpu_count() or 1),
                        "goroutines": "0", "max_procs": str(os.cpu_count() or 1), "version": "python"},
            "serf_lan": {"members": "1", "failed": "0", "left": "0", "health_score": "0"},
        },
        "xDS": None,
    })


def _service_body(body: dict[str, Any]) -> dict[str, Any]:
    name = _field(body, "Name") or _field(body, "Service")
    if not name or not isinstance(name, str):
        raise HTTPError(400, "Missing service name")
    port = _field(body, "Port", 0) or 0
    if not isinstance(port, int) or not 0 <= port < 65536:
        raise HTTPError(400, "Request decode failed: Port must be an integer 0..65535")
    tags = _field(body, "Tags") or []
    meta = _field(body, "Meta") or {}
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags) or not isinstance(meta, dict):
        raise HTTPError(400, "Request decode failed: Tags must be a list of strings and Meta an object")
    return {"ID": _field(body, "ID") or name, "Service": name, "Tags": tags, "Address": _field(body, "Address") or "",
            "Port": port, "Meta": meta, "EnableTagOverride": bool(_field(body, "EnableTagOverride"))}


async def agent_service_register(request: web.Request) -> web.StreamResponse:
    """A service registered with the local agent lands in the catalog on the agent's node."""
    _methods(request, "PUT")
    server = _server(request)
    body = await _json_object_body(request)
    service = _service_body(body)
    _require_write(request, "service:write", service["Service"])
    server.commit(server.store.catalog_register(
        {"Node": server.node_name, "ID": server.node_id, "Address": server.advertise_addr,
         "Datacenter": server.datacenter, "SkipNodeUpdate": True}, service, []))
    return web.Response(status=200)


async def agent_service_deregister(request: web.Request) -> web.StreamResponse:
    _methods(request, "PUT")
    server = _server(request)
    sid = request.match_info["id"]
    _require_write(request, "service:write", sid)
    if (server.node_name, sid) not in server.store.rows["services"]:
        raise HTTPError(404, f'Unknown service ID "{sid}". Ensure that the service ID is passed, not the service name.')
    server.commit(server.store.catalog_deregister(server.node_name, service_id=sid, now=time.monotonic()))
    return web.Response(status=200)


async def agent_services(request: web.Request) -> web.StreamResponse:
    _methods(request, "GET")
    server = _server(request)
    _require_write(request, "agent:read", server.node_name)
    out = {}
    for svc in server.store.node_services(server.node_name):
        out[svc["ID"]] = {"ID": svc["ID"], "Service": svc["Service"], "Tags": svc["Tags"], "Meta": svc["Meta"],
                          "Port": svc["Port"], "Address": svc["Address"], "Datacenter": server.datacenter,
                          "EnableTagOverride": svc["EnableTagOverride"],
                          "Weights": {"Passing": 1, "Warning": 1}}
    return _json(out)


# ------------------------------------------------------------------ catalog

async def catalog_register(request: web.Request) -> web.StreamResponse:
    _methods(request, "PUT")
    _check_dc(request)
    server = _server(request)
    body = await _json_object_body(request)
    node = _field(body, "Node")
    address = _field(body, "Address")
    if not node or not address:
        raise HTTPError(500, "Must provide node and address")
    node_meta = _field(body, "NodeMeta") or {}
    if not isinstance(node_meta, dict) or not all(isinstance(v, str) for v in node_meta.values()):
        raise HTTPError(400, "Request decode failed: NodeMeta must map strings to strings")
    _require_write(request, "node:write", node)
    raw_service = _field(body, "Service")
    service = _service_body(raw_service) if isinstance(raw_service, dict) else None
    checks = []
    for raw in ([_field(body, "Check")] if _field(body, "Check") else []) + list(_field(body, "Checks") or []):
        if isinstance(raw, dict) and _field(raw, "CheckID", _field(raw, "Name")):
            checks.append({"CheckID": _field(raw, "CheckID") or _field(raw, "Name"), "Name": _field(raw, "Name", ""),
                           "Status": _field(raw, "Status") or "critical", "Notes": _field(raw, "Notes") or "",
                           "Output": _field(raw, "Output") or "", "ServiceID": _field(raw, "ServiceID") or "",
                           "ServiceName": service["Service"] if service and _field(raw, "ServiceID") else ""})
    server.commit(server.store.catalog_register(
        {"Node": node, "ID": _field(body, "ID") or "", "Address": address,
         "Datacenter": _field(body, "Datacenter") or server.datacenter,
         "TaggedAddresses": _field(body, "TaggedAddresses"), "Meta": node_meta,
         "SkipNodeUpdate": bool(_field(body, "SkipNodeUpdate"))}, service, checks, now=time.monotonic()))
    return _json(True)


async def catalog_deregister(request: web.Request) -> web.StreamResponse:
    _methods(request, "PUT")
    _check_dc(request)
    server = _server(request)
    body = await _json_object_body(request)
    node = _field(body, "Node")
    if not node:
        raise HTTPError(500, "Must provide node")
    _require_write(request, "node:write", node)
    server.commit(server.store.catalog_deregister(node, service_id=_field(body, "ServiceID"),
                                                  check_id=_field(body, "CheckID"), now=time.monotonic()))
    return _json(True)


def _node_meta_filter(request: web.Request) -> dict[str, str]:
    out = {}
    for raw in request.query.getall("node-meta", []):
        key, _, value = raw.partition(":")
        out[key] = value
    return out


async def catalog_services(request: web.Request) -> web.StreamResponse:
    _methods(request, "GET")
    _check_dc(request)
    store = _server(request).store
    allowed = _server(request).acl.allowed(_identity(request))
    meta = _node_meta_filter(request)

    def compute() -> tuple[int, Any, tuple[str, str | None, bool]]:
        idx, services = store.catalog_services()
        if meta:
            services = {name: tags for name, tags in services.items() if store.catalog_service(name, None, meta)[1]}
        return idx, services if allowed else {}, ("services", None, True)

    index, services = await _blocking(request, compute)
    return _json(services, headers=_query_meta(request, index))


async def catalog_service(request: web.Request) -> web.StreamResponse:
    _methods(request, "GET")
    _check_dc(request)
    store = _server(request).store
    allowed = _server(request).acl.allowed(_identity(request))
    name = request.match_info["name"]
    tag = request.query.get("tag")
    meta = _node_meta_filter(request)

    def compute() -> tuple[int, Any, tuple[str, str | None, bool]]:
        idx, instances = store.catalog_service(name, tag, meta)
        return idx, instances if allowed else [], ("services", None, True)

    index, instances = await _blocking(request, compute)
    return _json(instances, headers=_query_meta(request, index))


async def health_service(request: web.Request) -> web.StreamResponse:
    """/v1/health/service/NAME: the catalog's instances with their node's and their own
    checks; `?passing` keeps the instances whose every check passes."""
    _methods(request, "GET")
    _check_dc(request)
    store = _server(request).store
    allowed = _server(request).acl.allowed(_identity(request))
    name = request.match_info["name"]
    tag = request.query.get("tag")
    passing = "passing" in request.query

    def compute() -> tuple[int, Any, tuple[str, str | None, bool]]:
        idx, instances = store.catalog_service(name, tag, None)
        entries = []
        for i in instances:
            checks = [dict(c) for (node, _cid), c in sorted(store.rows["checks"].items())
                      if node == i["Node"] and c.get("ServiceID", "") in ("", i["ServiceID"])]
            if passing and any(c.get("Status") != "passing" for c in checks):
                continue
            entries.append({"Node": {"ID": i["ID"], "Node": i["Node"], "Address": i["Address"],
                                     "Datacenter": i["Datacenter"], "Meta": i["NodeMeta"]},
                            "Service": {"ID": i["ServiceID"], "Service": i["ServiceName"], "Tags": i["ServiceTags"],
                                        "Address": i["ServiceAddress"], "Port": i["ServicePort"],
                                        "Meta": i["ServiceMeta"]},
                            "Checks": checks})
        return max(idx, store.table_index["checks"]), entries if allowed else [], ("services", None, True)

    index, entries = await _blocking(request, compute)
    return _json(entries, headers=_query_meta(request, index))


async def catalog_nodes(request: web.Request) -> web.StreamResponse:
    _methods(request, "GET")
    _check_dc(request)
    store = _server(request).store
    allowed = _server(request).acl.allowed(_identity(request))

    def compute() -> tuple[int, Any, tuple[str, str | None, bool]]:
        idx, nodes = store.catalog_nodes()
        return idx, nodes if allowed else [], ("nodes", None, True)

    index, nodes = await _blocking(request, compute)
    return _json(nodes, headers=_query_meta(request, index))


async def catalog_datacenters(request: web.Request) -> web.StreamResponse:
    _methods(request, "GET")
    return _json([_server(request).datacenter])


def _acl_manager(request: web.Request) -> None:
    """Consul's answers when ACLs are off (401) or the token may not write ACLs (403)."""
    server = _server(request)
    if not server.acl.enabled:
        raise HTTPError(401, "ACL support disabled")
    if _identity(request) is not Identity.MASTER:
        raise HTTPError(403, "Permission denied: token lacks permission 'acl:write'")


async def acl_token_create(request: web.Request) -> web.StreamResponse:
    """PUT /v1/acl/token: a new token (SecretID from the body, else random)."""
    _methods(request, "PUT")
    _acl_manager(request)
    body = await _json_object_body(request)
    secret = _field(body, "SecretID")
    if secret is not None and (not isinstance(secret, str) or not secret):
        raise HTTPError(400, "Invalid SecretID: must be a non-empty string")
    try:
        accessor, secret = _server(request).acl.create(secret)
    except ValueError as exc:
        raise HTTPError(500, f"Failed to create token: {exc}") from None
    index = _server(request).store.index
    return _json({"AccessorID": accessor, "SecretID": secret, "Description": _field(body, "Description", ""),
                  "Policies": _field(body, "Policies") or [], "Local": False, "CreateIndex": index,
                  "ModifyIndex": index})


async def acl_token_delete(request: web.Request) -> web.StreamResponse:
    """DELETE /v1/acl/token/<AccessorID>: revoked at once (Consul answers true, known or not)."""
    _methods(request, "DELETE")
    _acl_manager(request)
    _server(request).acl.revoke(request.match_info["accessor"])
    return _json(True)


async def devconsul_debug(request: web.Request) -> web.StreamResponse:
    """Not a Consul endpoint: how many blocking queries are parked, so tests and the
    benchmark can tell a watcher is waiting server-side without sleeping."""
    _methods(request, "GET")
    server = _server(request)
    return _json({"parked_queries": len(server.waiters), "index": server.store.index})


# ------------------------------------------------------------------ app

@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except HTTPError as exc:
        return _text(exc.status, exc.reason, exc.headers)
    except web.HTTPNotFound:
        return _text(404, "404 page not found\n")
    except web.HTTPException:
        raise
    except Exception as exc:  # a bug: one line in the log and Consul's plain 500, never a traceback page
        log.error("%s %s failed: %s: %s", request.method, request.path, type(exc).__name__, exc)
        return _text(500, f"Internal error: {type(exc).__name__}\n")


ROUTES: list[tuple[str, Handler]] = [
    ("/v1/kv/{key:.*}", kv_endpoint),
    ("/v1/txn", txn_endpoint),
    ("/v1/session/create", session_create),
    ("/v1/session/destroy/{id}", session_destroy),
    ("/v1/session/renew/{id}", session_renew),
    ("/v1/session/info/{id}", session_info),
    ("/v1/session/list", session_list),
    ("/v1/session/node/{node}", session_node),
    ("/v1/status/leader", status_leader),
    ("/v1/status/peers", status_peers),
    ("/v1/agent/self", agent_self),
    ("/v1/agent/services", agent_services),
    ("/v1/agent/service/register", agent_service_register),
    ("/v1/agent/service/deregister/{id}", agent_service_deregister),
    ("/v1/catalog/register", catalog_register),
    ("/v1/catalog/deregister", catalog_deregister),
    ("/v1/catalog/services", catalog_services),
    ("/v1/catalog/service/{name}", catalog_service),
    ("/v1/catalog/nodes", catalog_nodes),
    ("/v1/health/service/{name}", health_service),
    ("/v1/catalog/datacenters", catalog_datacenters),
    ("/v1/acl/token", acl_token_create),
    ("/v1/acl/token/{accessor}", acl_token_delete),
    ("/v1/devconsul/debug", devconsul_debug),
]


def build_app(server: DevConsulServer) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=BODY_MAX_BYTES)
    app[SERVER_KEY] = server
    app[_BODY_CACHE] = {}
    for path, handler in ROUTES:
        app.router.add_route("*", path, handler)

    async def on_startup(app: web.Application) -> None:
        server.start()

    async def on_cleanup(app: web.Application) -> None:
        server.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
