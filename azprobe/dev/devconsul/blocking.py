"""Blocking-query waiters: one asyncio future per parked query, no thread, no task.

A waiter names the table it reads and, for KV, the key prefix it covers. A commit wakes
only the waiters whose table changed and (for KV) whose prefix covers a changed key, so
500 watchers on `azprobe/v1/weights` cost a string compare each per write. A waiter whose
answer fell back to the table-wide index (a missing key, an empty prefix) must wake on
any KV change, because that index moves with every KV write: `any_key=True`.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from azprobe.dev.devconsul.store import Commit

DEFAULT_WAIT_S = 300.0  # Consul: 5 minutes when `wait` is absent
MAX_WAIT_S = 600.0  # Consul's maxQueryTime
JITTER_FRACTION = 16  # Consul adds up to wait/16 so parked clients do not wake in lockstep


def query_timeout(wait_s: float | None) -> float:
    """Consul's blockingQuery timeout: default/clamped wait plus random jitter."""
    timeout = DEFAULT_WAIT_S if not wait_s or wait_s <= 0 else min(wait_s, MAX_WAIT_S)
    return timeout + random.uniform(0, timeout / JITTER_FRACTION)


@dataclass(eq=False)
class Waiter:
    table: str
    prefix: str | None  # KV: the key or prefix read; None for non-KV tables
    any_key: bool
    future: asyncio.Future[bool]


class Waiters:
    def __init__(self) -> None:
        self._by_table: dict[str, set[Waiter]] = {}
        self.closed = False

    def __len__(self) -> int:
        return sum(len(s) for s in self._by_table.values())

    def add(self, table: str, prefix: str | None = None, any_key: bool = False) -> Waiter:
        waiter = Waiter(table, prefix, any_key, asyncio.get_running_loop().create_future())
        self._by_table.setdefault(table, set()).add(waiter)
        return waiter

    def release_all(self) -> None:
        """Shutting down: every parked query answers now (with what it has), so the
        server stops at once instead of waiting out each query's `wait`; later queries
        do not park at all."""
        self.closed = True
        for waiters in self._by_table.values():
            for waiter in waiters:
                if not waiter.future.done():
                    waiter.future.set_result(False)
        self._by_table.clear()

    def discard(self, waiter: Waiter) -> None:
        self._by_table.get(waiter.table, set()).discard(waiter)

    def notify(self, commit: Commit) -> None:
        for table in commit.tables:
            waiters = self._by_table.get(table)
            if not waiters:
                continue
            fired = [w for w in waiters if self._covers(w, commit)]
            for waiter in fired:
                waiters.discard(waiter)
                if not waiter.future.done():
                    waiter.future.set_result(True)

    @staticmethod
    def _covers(waiter: Waiter, commit: Commit) -> bool:
        if waiter.table != "kvs" or waiter.any_key or waiter.prefix is None:
            return True
        prefix = waiter.prefix
        return any(key.startswith(prefix) for key in commit.kv_keys)

    async def wait(self, waiter: Waiter, timeout: float) -> bool:
        """True when woken by a commit, False on timeout (or shutdown)."""
        if timeout <= 0 or self.closed:
            self.discard(waiter)
            return False
        loop = asyncio.get_running_loop()
        handle = loop.call_later(timeout, _expire, waiter.future)
        try:
            return await waiter.future
        finally:
            handle.cancel()
            self.discard(waiter)


def _expire(future: asyncio.Future[bool]) -> None:
    if not future.done():
        future.set_result(False)
