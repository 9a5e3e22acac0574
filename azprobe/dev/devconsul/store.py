"""The devconsul state machine: KV, sessions, locks, transactions and a small catalog,
indexed the way Consul's state store is (one raft-like global index per committed write,
a max index per table, tombstones so a prefix's index never goes backwards on delete).

Pure: no I/O, no clocks. Every write returns a `Commit` (the index plus the mutations it
made); the server persists it, wakes blocking queries and arms session timers. Replaying
the same commits into a fresh Store rebuilds the same state, which is what the write-ahead
log does at boot. Time only enters through `now` arguments (lock-delay).
"""

from __future__ import annotations

import bisect
import uuid
from dataclasses import dataclass, field
from typing import Any

# Consul's server-side session limits (structs.SessionTTLMax, config SessionTTLMin).
SESSION_TTL_MIN_NS = 10 * 1_000_000_000
SESSION_TTL_MAX_NS = 86_400 * 1_000_000_000
DEFAULT_LOCK_DELAY_NS = 15 * 1_000_000_000
SERF_CHECK_ID = "serfHealth"

TABLES = ("kvs", "sessions", "nodes", "services", "checks")
_MISSING = object()

Entry = dict[str, Any]  # a KV entry in Consul's DirEntry shape; Value is bytes here


class StoreError(Exception):
    """A request Consul rejects with an error (HTTP 500 with this text, or a txn error)."""


@dataclass
class Commit:
    index: int
    mutations: list[list[Any]]
    kv_keys: set[str] = field(default_factory=set)
    tables: set[str] = field(default_factory=set)


@dataclass
class TxnResult:
    results: list[dict[str, Entry]] | None
    errors: list[dict[str, Any]] | None
    commit: Commit | None


def _row_key(table: str, key: Any) -> Any:
    # services and checks are keyed by (node, id); JSON carries them as lists
    return tuple(key) if isinstance(key, list) else key


class Store:
    def __init__(self) -> None:
        self.index = 0  # the raft-like index of the last commit
        self.rows: dict[str, dict[Any, Any]] = {t: {} for t in TABLES}
        self.table_index: dict[str, int] = {t: 0 for t in TABLES}
        self.tombstones: dict[str, int] = {}  # deleted KV key -> index of the delete
        self.service_index: dict[str, int] = {}  # service name -> last change (Consul "service.<name>")
        self._kv_sorted: list[str] = []
        self._tomb_sorted: list[str] = []
        self.lock_delays: dict[str, float] = {}  # key -> monotonic expiry; memory only, as in Consul
        self._undo: list[tuple[str, Any, Any, Any]] | None = None
        self._pending: Commit | None = None

    # ---------------------------------------------------------------- low level

    def _apply_mutation(self, mutation: list[Any], idx: int) -> None:
        """Apply one mutation at index idx (shared by live writes and WAL replay)."""
        table, raw_key, value = mutation
        key = _row_key(table, raw_key)
        rows = self.rows[table]
        if table == "services":
            old = rows.get(key)
            for svc in (old, value):
                if svc is not None:
                    self.service_index[svc["Service"]] = idx
        if value is None:
            if rows.pop(key, None) is not None and table == "kvs":
                self._kv_sorted.pop(bisect.bisect_left(self._kv_sorted, key))
            if table == "kvs":
                if key not in self.tombstones:
                    bisect.insort(self._tomb_sorted, key)
                self.tombstones[key] = idx
        else:
            if table == "kvs" and key not in rows:
                bisect.insort(self._kv_sorted, key)
            rows[key] = value
        self.table_index[table] = idx

    def _mutate(self, table: str, key: Any, value: Any) -> None:
        assert self._pending is not None and self._undo is not None, "write outside a commit"
        rows = self.rows[table]
        self._undo.append((table, key, rows.get(key, _MISSING),
                           self.tombstones.get(key, _MISSING) if table == "kvs" else _MISSING))
        self._apply_mutation([table, list(key) if isinstance(key, tuple) else key, value], self._pending.index)
        self._pending.mutations.append([table, list(key) if isinstance(key, tuple) else key, value])
        self._pending.tables.add(table)
        if table == "kvs":
            self._pending.kv_keys.add(key)

    def _begin(self) -> int:
        self._undo = []
        self._saved = (dict(self.table_index), dict(self.service_index))
        self._pending = Commit(index=self.index + 1, mutations=[])
        return self._pending.index

    def _rollback(self) -> None:
        assert self._undo is not None
        for table, key, old, old_tomb in reversed(self._undo):
            rows = self.rows[table]
            if table == "kvs":
                if old is _MISSING and key in rows:
                    self._kv_sorted.pop(bisect.bisect_left(self._kv_sorted, key))
                elif old is not _MISSING and key not in rows:
                    bisect.insort(self._kv_sorted, key)
                if old_tomb is _MISSING and key in self.tombstones:
                    del self.tombstones[key]
                    self._tomb_sorted.pop(bisect.bisect_left(self._tomb_sorted, key))
                elif old_tomb is not _MISSING:
                    if key not in self.tombstones:
                        bisect.insort(self._tomb_sorted, key)
                    self.tombstones[key] = old_tomb
            if old is _MISSING:
                rows.pop(key, None)
            else:
                rows[key] = old
        self.table_index, self.service_index = self._saved
        self._undo = None
        self._pending = None

    def _finish(self) -> Commit | None:
        commit = self._pending
        self._undo = None
        self._pending = None
        if commit is None or not commit.mutations:
            return None  # nothing changed: no index is consumed
        self.index = commit.index
        return commit

    def replay(self, commit_index: int, mutations: list[list[Any]]) -> None:
        """Re-apply a committed record from the write-ahead log."""
        for mutation in mutations:
            self._apply_mutation(mutation, commit_index)
        self.index = max(self.index, commit_index)

    # ---------------------------------------------------------------- KV reads

    def kv_get(self, key: str) -> tuple[int, Entry | None]:
        """Consul's KVS.Get: the entry's ModifyIndex if it exists, else the table index."""
        entry = self.rows["kvs"].get(key)
        if entry is not None:
            return entry["ModifyIndex"], entry
        return self._kvs_table_index(), None

    def _kvs_table_index(self) -> int:
        return self.table_index["kvs"]

    def _prefix_range(self, sorted_keys: list[str], prefix: str) -> list[str]:
        start = bisect.bisect_left(sorted_keys, prefix)
        out = []
        for i in range(start, len(sorted_keys)):
            k = sorted_keys[i]
            if not k.startswith(prefix):
                break
            out.append(k)
        return out

    def _prefix_index(self, prefix: str, entries: list[Entry]) -> int:
        """KVS.List/ListKeys: highest ModifyIndex or tombstone under the prefix; with no
        entries and no tombstones, the whole table's index (never 0 after the caller's fixup)."""
        if prefix == "":
            return self._kvs_table_index()
        idx = max((e["ModifyIndex"] for e in entries), default=0)
        for k in self._prefix_range(self._tomb_sorted, prefix):
            idx = max(idx, self.tombstones[k])
        return idx or self._kvs_table_index()

    def kv_list(self, prefix: str) -> tuple[int, list[Entry]]:
        rows = self.rows["kvs"]
        entries = [rows[k] for k in self._prefix_range(self._kv_sorted, prefix)]
        return self._prefix_index(prefix, entries), entries

    def kv_keys(self, prefix: str, separator: str = "") -> tuple[int, list[str], list[Entry]]:
        idx, entries = self.kv_list(prefix)
        keys: list[str] = []
        for e in entries:
            k = e["Key"]
            if separator:
                cut = k.find(separator, len(prefix))
                if cut >= 0:
                    k = k[: cut + len(separator)]
            if not keys or keys[-1] != k:
                keys.append(k)
        return idx, keys, entries

    # ---------------------------------------------------------------- KV writes

    def _set_entry(self, idx: int, key: str, value: bytes, flags: int, session: str | None) -> Entry:
        """kvsSetTxn: keep CreateIndex/LockIndex and (unless session is given) the holder."""
        existing = self.rows["kvs"].get(key)
        entry = {"LockIndex": 0, "Key": key, "Flags": flags, "Value": value, "Session": "",
                 "CreateIndex": idx, "ModifyIndex": idx}
        if existing is not None:
            entry["CreateIndex"] = existing["CreateIndex"]
            entry["LockIndex"] = existing["LockIndex"]
            entry["Session"] = existing["Session"]
        if session is not None:
            entry["Session"] = session
        self._mutate("kvs", key, entry)
        return entry

    def _op_set(self, idx: int, key: str, value: bytes, flags: int) -> Entry:
        return self._set_entry(idx, key, value, flags, None)

    def _op_cas(self, idx: int, key: str, value: bytes, flags: int, cas: int) -> Entry | None:
        existing = self.rows["kvs"].get(key)
        if cas == 0 and existing is not None:
            return None
        if cas != 0 and (existing is None or existing["ModifyIndex"] != cas):
            return None
        return self._set_entry(idx, key, value, flags, None)

    def lock_delay_active(self, key: str, now: float) -> bool:
        expiry = self.lock_delays.get(key)
        if expiry is None:
            return False
        if expiry <= now:
            del self.lock_delays[key]
            return False
        return True

    def _op_lock(self, idx: int, key: str, value: bytes, flags: int, session: str) -> Entry | None:
        if not session:
            raise StoreError("missing session")
        if session not in self.rows["sessions"]:
            raise StoreError(f'invalid session "{session}"')
        existing = self.rows["kvs"].get(key)
        lock_index = 1
        create_index = idx
        if existing is not None:
            create_index = existing["CreateIndex"]
            if existing["Session"] == session:
                lock_index = existing["LockIndex"]  # re-acquire by the holder: no new lock
            elif existing["Session"]:
                return None
            else:
                lock_index = existing["LockIndex"] + 1
        entry = {"LockIndex": lock_index, "Key": key, "Flags": flags, "Value": value, "Session": session,
                 "CreateIndex": create_index, "ModifyIndex": idx}
        self._mutate("kvs", key, entry)
        return entry

    def _op_unlock(self, idx: int, key: str, value: bytes, flags: int, session: str) -> Entry | None:
        existing = self.rows["kvs"].get(key)
        if existing is None or existing["Session"] != session:
            return None
        entry = {"LockIndex": existing["LockIndex"], "Key": key, "Flags": flags, "Value": value,
                 "Session": "", "CreateIndex": existing["CreateIndex"], "ModifyIndex": idx}
        self._mutate("kvs", key, entry)
        return entry

    def _op_delete(self, key: str) -> None:
        if key in self.rows["kvs"]:
            self._mutate("kvs", key, None)

    def _op_delete_cas(self, key: str, cas: int) -> bool:
        existing = self.rows["kvs"].get(key)
        if existing is None:
            return True  # Consul: nothing to delete counts as success
        if existing["ModifyIndex"] != cas:
            return False
        self._mutate("kvs", key, None)
        return True

    def _op_delete_tree(self, prefix: str) -> None:
        for k in self._prefix_range(self._kv_sorted, prefix):
            self._mutate("kvs", k, None)

    def kv_apply(self, op: str, key: str, value: bytes = b"", flags: int = 0, cas: int = 0,
                 session: str = "", now: float = 0.0) -> tuple[bool, Commit | None]:
        """One KVS.Apply (PUT/DELETE on /v1/kv). Returns (the true/false body, commit)."""
        if op == "lock" and self.lock_delay_active(key, now):
            return False, None  # enforced before commit, as Consul's kvsPreApply does
        idx = self._begin()
        try:
            if op == "set":
                ok = self._op_set(idx, key, value, flags) is not None
            elif op == "cas":
                ok = self._op_cas(idx, key, value, flags, cas) is not None
            elif op == "lock":
                ok = self._op_lock(idx, key, value, flags, session) is not None
            elif op == "unlock":
                ok = self._op_unlock(idx, key, value, flags, session) is not None
            elif op == "delete":
                self._op_delete(key)
                ok = True
            elif op == "delete-cas":
                ok = self._op_delete_cas(key, cas)
            elif op == "delete-tree":
                self._op_delete_tree(key)
                ok = True
            else:
                raise StoreError(f'unknown KV verb "{op}"')
        except BaseException:
            self._rollback()
            raise
        return ok, self._finish()

    # ---------------------------------------------------------------- transactions

    def txn(self, ops: list[dict[str, Any]], now: float = 0.0, max_result_bytes: int | None = None) -> TxnResult:
        """Apply KV ops all-or-nothing. Each op: {"Verb","Key","Value"(bytes),"Flags","Index","Session"}.
        `max_result_bytes`: the Values the results may carry in all; the op whose
        results cross it fails the transaction (None: no bound)."""
        errors: list[dict[str, Any]] = []
        # lock-delay is checked before the apply, like Consul's txn preCheck
        for i, op in enumerate(ops):
            if op["Verb"] == "lock" and self.lock_delay_active(op["Key"], now):
                errors.append({"OpIndex": i, "What": f'failed to lock key "{op["Key"]}" due to lock delay'})
        if errors:
            return TxnResult(None, errors, None)
        idx = self._begin()
        results: list[dict[str, Entry]] = []
        result_bytes = 0
        for i, op in enumerate(ops):
            try:
                entries = self._txn_op(idx, op)
                result_bytes += sum(len(e["Value"] or b"") for e in entries)
                if max_result_bytes is not None and result_bytes > max_result_bytes:
                    raise StoreError(f"transaction results exceed {max_result_bytes} bytes of values: "
                                     "read the keys in separate requests")
                results.extend({"KV": e} for e in entries)
            except StoreError as exc:
                self._rollback()
                return TxnResult(None, [{"OpIndex": i, "What": str(exc)}], None)
        return TxnResult(results, None, self._finish())

    def _txn_op(self, idx: int, op: dict[str, Any]) -> list[Entry]:
        verb, key = op["Verb"], op["Key"]
        value, flags, index, session = op.get("Value") or b"", op.get("Flags", 0), op.get("Index", 0), op.get("Session", "")
        rows = self.rows["kvs"]
        entry: Entry | None
        if verb == "set":
            entry = self._op_set(idx, key, value, flags)
        elif verb == "cas":
            entry = self._op_cas(idx, key, value, flags, index)
            if entry is None:
                raise StoreError(f'failed to set key "{key}", index is stale')
        elif verb == "lock":
            entry = self._op_lock(idx, key, value, flags, session)
            if entry is None:
                raise StoreError(f'failed to lock key "{key}", lock is already held')
        elif verb == "unlock":
            entry = self._op_unlock(idx, key, value, flags, session)
            if entry is None:
                raise StoreError(f'failed to unlock key "{key}", lock isn\'t held, or is held by another session')
        elif verb == "get":
            entry = rows.get(key)
            if entry is None:
                raise StoreError(f'key "{key}" doesn\'t exist')
            return [entry]  # a get keeps its value; every other verb's result has Value null
        elif verb == "get-tree":
            return self.kv_list(key)[1]
        elif verb == "check-index":
            entry = rows.get(key)
            if entry is None:
                raise StoreError(f'failed to check index, key "{key}" doesn\'t exist')
            if entry["ModifyIndex"] != index:
                raise StoreError(f'failed index check for key "{key}", current modify index {entry["ModifyIndex"]} != {index}')
        elif verb == "check-session":
            entry = rows.get(key)
            if entry is None:
                raise StoreError(f'failed to check session, key "{key}" doesn\'t exist')
            if entry["Session"] != session:
                raise StoreError(f'failed session check for key "{key}", current session {entry["Session"]} != {session}')
        elif verb == "check-not-exists":
            if key in rows:
                raise StoreError(f'key "{key}" exists')
            entry = None
        elif verb == "delete":
            self._op_delete(key)
            entry = None
        elif verb == "delete-tree":
            self._op_delete_tree(key)
            entry = None
        elif verb == "delete-cas":
            if not self._op_delete_cas(key, index):
                raise StoreError(f'failed to delete key "{key}", index is stale')
            entry = None
        else:
            raise StoreError(f'unknown KV verb "{verb}"')
        return [] if entry is None else [dict(entry, Value=None)]

    # ---------------------------------------------------------------- sessions

    def session_create(self, node: str, name: str = "", behavior: str = "release", ttl: str = "",
                       lock_delay_ns: int = DEFAULT_LOCK_DELAY_NS, checks: list[str] | None = None,
                       session_id: str | None = None) -> tuple[str, Commit]:
        if behavior not in ("release", "delete"):
            raise StoreError(f"Invalid Behavior setting '{behavior}'")
        if node not in self.rows["nodes"]:
            raise StoreError("Missing node registration")
        checks = [SERF_CHECK_ID] if checks is None else list(checks)
        for check in checks:
            if (node, check) not in self.rows["checks"]:
                raise StoreError(f"Missing check '{check}' registration")
        sid = session_id or str(uuid.uuid4())
        idx = self._begin()
        session = {"ID": sid, "Name": name, "Node": node, "LockDelay": lock_delay_ns, "Behavior": behavior,
                   "TTL": ttl, "NodeChecks": checks, "ServiceChecks": None,
                   "CreateIndex": idx, "ModifyIndex": idx}
        self._mutate("sessions", sid, session)
        commit = self._finish()
        assert commit is not None
        return sid, commit

    def session_get(self, sid: str) -> dict[str, Any] | None:
        return self.rows["sessions"].get(sid)

    def session_list(self, node: str | None = None) -> tuple[int, list[dict[str, Any]]]:
        sessions = sorted(self.rows["sessions"].values(), key=lambda s: s["ID"])
        if node is not None:
            sessions = [s for s in sessions if s["Node"] == node]
        return self.table_index["sessions"], sessions

    def session_destroy(self, sid: str, now: float) -> Commit | None:
        """Invalidate a session (destroy, TTL expiry, node or check gone): release or
        delete the keys it holds and start their lock-delay."""
        self._begin()
        self._invalidate(sid, now)
        return self._finish()

    def _invalidate(self, sid: str, now: float) -> None:
        session = self.rows["sessions"].get(sid)
        if session is None:
            return
        idx = self._pending.index  # type: ignore[union-attr]
        held = [e for e in self.rows["kvs"].values() if e["Session"] == sid]
        for e in held:
            if session["Behavior"] == "delete":
                self._mutate("kvs", e["Key"], None)
            else:
                self._mutate("kvs", e["Key"], dict(e, Session="", ModifyIndex=idx))
            if session["LockDelay"] > 0:
                self.lock_delays[e["Key"]] = now + session["LockDelay"] / 1e9
        self._mutate("sessions", sid, None)

    # ---------------------------------------------------------------- catalog

    def catalog_register(self, node: dict[str, Any], service: dict[str, Any] | None,
                         checks: list[dict[str, Any]], now: float = 0.0) -> Commit | None:
        idx = self._begin()
        name = node["Node"]
        existing = self.rows["nodes"].get(name)
        row = {"ID": node.get("ID", ""), "Node": name, "Address": node.get("Address", ""),
               "Datacenter": node.get("Datacenter", ""), "TaggedAddresses": node.get("TaggedAddresses"),
               "Meta": node.get("Meta") or {}, "CreateIndex": idx, "ModifyIndex": idx}
        if existing is not None:
            row["CreateIndex"] = existing["CreateIndex"]
            same = {k: existing[k] for k in row if k not in ("CreateIndex", "ModifyIndex")} == \
                   {k: row[k] for k in row if k not in ("CreateIndex", "ModifyIndex")}
            if same or node.get("SkipNodeUpdate"):
                row = existing
        if row is not existing:
            self._mutate("nodes", name, row)
        if service is not None:
            sid = service.get("ID") or service["Service"]
            old = self.rows["services"].get((name, sid))
            svc = {"ID": sid, "Service": service["Service"], "Tags": service.get("Tags") or [],
                   "Address": service.get("Address", ""), "Meta": service.get("Meta") or {},
                   "Port": service.get("Port", 0), "EnableTagOverride": bool(service.get("EnableTagOverride")),
                   "CreateIndex": old["CreateIndex"] if old else idx, "ModifyIndex": idx}
            if old is None or {k: v for k, v in old.items() if k != "ModifyIndex"} != \
                    {k: v for k, v in svc.items() if k != "ModifyIndex"}:
                self._mutate("services", (name, sid), svc)
        for check in checks:
            cid = check["CheckID"]
            old = self.rows["checks"].get((name, cid))
            row_c = {"Node": name, "CheckID": cid, "Name": check.get("Name", cid),
                     "Status": check.get("Status", "critical"), "Notes": check.get("Notes", ""),
                     "Output": check.get("Output", ""), "ServiceID": check.get("ServiceID", ""),
                     "ServiceName": check.get("ServiceName", ""),
                     "CreateIndex": old["CreateIndex"] if old else idx, "ModifyIndex": idx}
            if old is None or {k: v for k, v in old.items() if k != "ModifyIndex"} != \
                    {k: v for k, v in row_c.items() if k != "ModifyIndex"}:
                self._mutate("checks", (name, cid), row_c)
        return self._finish()

    def catalog_deregister(self, node: str, service_id: str | None = None, check_id: str | None = None,
                           now: float = 0.0) -> Commit | None:
        self._begin()
        if service_id:
            if (node, service_id) in self.rows["services"]:
                self._mutate("services", (node, service_id), None)
            for key, check in list(self.rows["checks"].items()):
                if key[0] == node and check["ServiceID"] == service_id:
                    self._mutate("checks", key, None)
        elif check_id:
            if (node, check_id) in self.rows["checks"]:
                self._mutate("checks", (node, check_id), None)
                for sid, s in list(self.rows["sessions"].items()):
                    if s["Node"] == node and check_id in (s["NodeChecks"] or []):
                        self._invalidate(sid, now)
        elif node in self.rows["nodes"]:
            # a node leaving takes its services, checks and sessions with it
            for key in [k for k in self.rows["services"] if k[0] == node]:
                self._mutate("services", key, None)
            for key in [k for k in self.rows["checks"] if k[0] == node]:
                self._mutate("checks", key, None)
            for sid, s in list(self.rows["sessions"].items()):
                if s["Node"] == node:
                    self._invalidate(sid, now)
            self._mutate("nodes", node, None)
        return self._finish()

    def catalog_services(self) -> tuple[int, dict[str, list[str]]]:
        out: dict[str, list[str]] = {}
        for svc in self.rows["services"].values():
            tags = out.setdefault(svc["Service"], [])
            for tag in svc["Tags"]:
                if tag not in tags:
                    tags.append(tag)
        return max(self.table_index["services"], self.table_index["nodes"]), dict(sorted(out.items()))

    def catalog_service(self, name: str, tag: str | None = None,
                        node_meta: dict[str, str] | None = None) -> tuple[int, list[dict[str, Any]]]:
        out = []
        for (node_name, _sid), svc in sorted(self.rows["services"].items()):
            if svc["Service"] != name or (tag is not None and tag not in svc["Tags"]):
                continue
            node = self.rows["nodes"][node_name]
            if node_meta and any(node["Meta"].get(k) != v for k, v in node_meta.items()):
                continue
            out.append({"ID": node["ID"], "Node": node_name, "Address": node["Address"],
                        "Datacenter": node["Datacenter"], "TaggedAddresses": node["TaggedAddresses"],
                        "NodeMeta": node["Meta"], "ServiceKind": "", "ServiceID": svc["ID"],
                        "ServiceName": svc["Service"], "ServiceTags": svc["Tags"],
                        "ServiceAddress": svc["Address"], "ServiceMeta": svc["Meta"],
                        "ServicePort": svc["Port"], "ServiceEnableTagOverride": svc["EnableTagOverride"],
                        "CreateIndex": svc["CreateIndex"], "ModifyIndex": svc["ModifyIndex"]})
        idx = self.service_index.get(name) or max(self.table_index["services"], self.table_index["nodes"])
        return idx, out

    def catalog_nodes(self) -> tuple[int, list[dict[str, Any]]]:
        return self.table_index["nodes"], [dict(n) for _, n in sorted(self.rows["nodes"].items())]

    def node_services(self, node: str) -> list[dict[str, Any]]:
        return [s for (n, _), s in sorted(self.rows["services"].items()) if n == node]

    # ---------------------------------------------------------------- snapshots

    def to_snapshot(self) -> dict[str, Any]:
        return {"index": self.index, "table_index": dict(self.table_index), "tombstones": dict(self.tombstones),
                "service_index": dict(self.service_index),
                "rows": {t: [[list(k) if isinstance(k, tuple) else k, v] for k, v in self.rows[t].items()]
                         for t in TABLES}}

    @classmethod
    def from_snapshot(cls, snap: dict[str, Any]) -> "Store":
        store = cls()
        store.index = snap["index"]
        store.table_index.update(snap["table_index"])
        store.tombstones = dict(snap["tombstones"])
        store._tomb_sorted = sorted(store.tombstones)
        store.service_index = dict(snap["service_index"])
        for table in TABLES:
            for raw_key, value in snap["rows"].get(table, []):
                store.rows[table][_row_key(table, raw_key)] = value
        store._kv_sorted = sorted(store.rows["kvs"])
        return store
