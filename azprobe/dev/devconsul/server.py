"""The devconsul process state around the pure Store: durability, wake-ups of blocking
queries, session TTL timers. Every write goes through `commit()`, in this order: log
(fsync) -> wake waiters -> arm/disarm session timers, so a client never sees an answer
that a crash could take back."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from pathlib import Path

from azprobe.dev.devconsul.acl import AclResolver
from azprobe.dev.devconsul.blocking import Waiters
from azprobe.dev.devconsul.durations import parse_go_duration_ns
from azprobe.dev.devconsul.persist import WriteAheadLog
from azprobe.dev.devconsul.store import SERF_CHECK_ID, Commit, Store

log = logging.getLogger(__name__)

# Consul invalidates a session only after TTL * SessionTTLMultiplier without a renew
# (agent/consul/session_ttl.go), to tolerate clock skew and slow renewals.
SESSION_TTL_MULTIPLIER = 2
VERSION = "1.17.0"  # the Consul API level devconsul imitates


class DevConsulServer:
    def __init__(self, node_name: str = "devconsul", datacenter: str = "dc1",
                 acl_master_token: str | None = None, data_dir: str | Path | None = None,
                 advertise_addr: str = "127.0.0.1") -> None:
        self.node_name = node_name
        self.node_id = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"devconsul.{node_name}"))
        self.datacenter = datacenter
        self.advertise_addr = advertise_addr
        self.acl = AclResolver(acl_master_token)
        self.wal = WriteAheadLog(Path(data_dir)) if data_dir else None
        self.store = self.wal.load() if self.wal else Store()
        self.waiters = Waiters()
        self._timers: dict[str, asyncio.TimerHandle] = {}

    @property
    def leader_addr(self) -> str:
        return f"{self.advertise_addr}:8300"

    def start(self) -> None:
        """Register our own node (with serfHealth, which sessions check by default) and
        restart every session's TTL, as a newly elected Consul leader does."""
        self.commit(self.store.catalog_register(
            {"Node": self.node_name, "ID": self.node_id, "Address": self.advertise_addr,
             "Datacenter": self.datacenter, "TaggedAddresses": {"lan": self.advertise_addr,
                                                                "wan": self.advertise_addr}},
            None, [{"CheckID": SERF_CHECK_ID, "Name": "Serf Health Status", "Status": "passing",
                    "Output": "Agent alive and reachable"}]))
        for sid in list(self.store.rows["sessions"]):
            self.reset_session_timer(sid)

    def commit(self, commit: Commit | None) -> None:
        if commit is None:
            return
        if self.wal is not None:
            self.wal.append(commit)
            if self.wal.should_snapshot():
                self.wal.snapshot(self.store)
        self.waiters.notify(commit)
        for table, key, value in commit.mutations:
            if table != "sessions":
                continue
            if value is None:
                timer = self._timers.pop(key, None)
                if timer is not None:
                    timer.cancel()
            elif key not in self._timers:
                self.reset_session_timer(key)

    def reset_session_timer(self, sid: str) -> None:
        session = self.store.session_get(sid)
        old = self._timers.pop(sid, None)
        if old is not None:
            old.cancel()
        if session is None or not session["TTL"]:
            return
        ttl_s = parse_go_duration_ns(session["TTL"]) / 1e9
        if ttl_s <= 0:
            return
        loop = asyncio.get_running_loop()
        self._timers[sid] = loop.call_later(ttl_s * SESSION_TTL_MULTIPLIER, self._expire_session, sid)

    def _expire_session(self, sid: str) -> None:
        self._timers.pop(sid, None)
        log.info("session %s expired (no renew within 2 x TTL)", sid)
        self.commit(self.store.session_destroy(sid, now=time.monotonic()))

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self.wal is not None:
            self.wal.close()
