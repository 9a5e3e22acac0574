"""`[agents] source = "prometheus"`: read agents' windows from a Prometheus-compatible
query API instead of pulling the agents (docs/prometheus.md).

Each cycle sends one instant query for raw samples (controller.prom_windows.query_for),
turns each node's new scrape pairs into windows and stores them in the same WindowStore
the direct pull fills. The first query reads the whole `lookback_s` (the backlog, as a
first pull reads an agent's ring); later ones read only back to the oldest cursor of the
nodes last seen, plus a margin: decoding the answer is most of the cost, and a 30 s
lookback at 1 s scrapes would re-read 30 samples per series for the 1-2 new ones. From there on, merge, the
detector, quorum, safety and the KV output are the direct path's code, untouched.

The surface mirrors controller.collect.Collector (pull_all, take_new, store, cursors,
counters, agent_states, set_targets, close), so the controller picks one or the other.
A node is an AgentCursor keyed "instance/node"; its `newest_end` is the scrape timestamp
of the last window read, so overlapping lookbacks never count a scrape twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

import aiohttp

from azprobe.contracts import bounded_json
from azprobe.contracts.window import Window, printable
from azprobe.controller.collect import (AgentCursor, AgentTarget, CollectCounters, Collector, PullResult,
                                        WindowStore)
from azprobe.controller.config import PrometheusSettings
from azprobe.controller.topology import Topology
from azprobe.controller.prom_windows import (ParsedAnswer, PromAnswerError, PromAnswerTooLarge, node_windows,
                                             parse_answer, query_for)

log = logging.getLogger(__name__)

FORGET_AFTER_WINDOWS = 10  # a node absent this many evaluation windows is forgotten
RANGE_MARGIN_S = 1.5  # clock skew and a scrape in flight
MIN_RANGE_S = 1.0


class PrometheusCollector:
    """Windows from Prometheus, one synthetic window per node per scrape interval."""

    def __init__(self, settings: PrometheusSettings, *, evaluation_window_s: float, stale_after_s: float,
                 topology: Topology, slot_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.topology = topology  # the controller's AZs, as for the direct pull
        self.stale_after_s = stale_after_s
        self.clock = clock
        self.store = WindowStore(evaluation_window_s, slot_s)
        self.cursors: dict[str, AgentCursor] = {}
        self.counters = CollectCounters()
        self._newest: float | None = None  # newest sample in the last answer (Prometheus clock)
        self._newest_wall = 0.0  # our wall clock when that answer arrived
        self._oldest_cursor: float | None = None  # oldest cursor among the nodes in that answer
        self._new: list[Window] = []
        self._session: aiohttp.ClientSession | None = None
        self._last_error = ""
        self._first_range = settings.lookback_s  # halved while the first answer is too large or slow

    # --- the Collector surface ------------------------------------------------------
    def set_targets(self, targets: Iterable[AgentTarget]) -> None:
        """Targets are Prometheus's business (its service discovery); nothing to do."""

    def take_new(self) -> list[Window]:
        new, self._new = self._new, []
        return new

    # The same rule as the direct pull: each cursor's state (it reads clock, cursors and
    # stale_after_s, which this class has too).
    agent_states = Collector.agent_states

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # --- one cycle ------------------------------------------------------------------
    async def pull_all(self) -> PullResult:
        started = self.clock()
        result = PullResult()
        try:
            body = await self._query()
            # Decoding a large answer takes a while: off the event loop, so /metrics,
            # /healthz and the Consul round are not held up by it.
            answer = await asyncio.to_thread(self._decode, body)
        except (asyncio.TimeoutError, TimeoutError):
            self._failed(result, f"query timeout after {self.settings.query_timeout_s}s")
            self.counters.pull_timeouts += 1
            self._shrink_range()
        except PromAnswerTooLarge as exc:
            self._failed(result, str(exc))
            self.counters.pull_errors += 1
            self._shrink_range()
        except (aiohttp.ClientError, OSError, ValueError) as exc:  # PromAnswerError, JsonRefused are ValueErrors
            self._failed(result, str(exc) or type(exc).__name__)
            self.counters.pull_errors += 1
        else:
            if self._last_error:
                log.info("prometheus answers again")
                self._last_error = ""
            self.counters.windows_garbage += answer.garbage_series
            result.ingested = self.ingest(answer, self.clock())
            self._remember_position(answer)
        now = self.clock()
        self.store.prune(now)
        self._forget(now)
        result.states = {s.value: n for s, n in self.agent_states(now).items()}
        result.duration_s = now - started
        return result

    def ingest(self, answer: ParsedAnswer, now: float) -> int:
        """Store every node's windows newer than its cursor; returns windows stored."""
        stored = 0
        for key, series in answer.nodes.items():
            # Ages by the node's own newest scrape, as the direct pull ages an agent's
            # windows by its own newest: one node's odd clock cannot age the others'.
            newest = max(series.info) if series.info else None
            cursor = self.cursors.get(key)
            if cursor is None:
                cursor = self.cursors[key] = AgentCursor(AgentTarget(url=f"prometheus:{key}", node=series.node))
            read = node_windows(series, cursor.newest_end)
            windows = read.windows
            self.counters.windows_garbage += read.garbage
            if read.gap:  # the node was away longer than the query's range
                self.counters.gap_events += 1
            cursor.newest_end = read.newest  # past garbage too: it is not re-read every cycle
            cursor.failures, cursor.last_error, cursor.last_ok = 0, "", now
            cursor.node = series.node
            for w in windows:
                w = self.topology.admit(w)
                if w is None:  # an AZ outside the topology: dropped and counted there
                    continue
                if cursor.boot_id is not None and w.boot_id != cursor.boot_id:
                    self.counters.agent_restarts += 1
                cursor.boot_id, cursor.az = w.boot_id, w.az
                cursor.last_seq = w.seq
                age = max(0.0, newest - w.end) if newest is not None else 0.0
                if age > self.store.horizon_s:
                    self.counters.windows_too_old += 1
                    continue
                if self.store.add(cursor.target.url, w, now - age):
                    self._new.append(w)
                    stored += 1
                    cursor.last_new_window = now
                else:
                    self.counters.windows_duplicate += 1
        self.counters.windows_ingested += stored
        return stored

    def _remember_position(self, answer: ParsedAnswer) -> None:
        cursors = [c.newest_end for key in answer.nodes if (c := self.cursors.get(key)) and c.newest_end is not None]
        if answer.newest is not None and cursors:
            self._newest, self._newest_wall, self._oldest_cursor = answer.newest, time.time(), min(cursors)

    def _shrink_range(self) -> None:
        """Too large or too slow. The first query reads the whole lookback, which a big
        fleet may not fit: halve it until it does (one scrape per node is enough, it sets
        the node's cursor). Later queries read only back to the cursors; if even those
        do not fit, raise max_response_bytes or narrow the selector."""
        if self._newest is None and self._first_range > MIN_RANGE_S:
            self._first_range = max(MIN_RANGE_S, self._first_range / 2)
            log.info("prometheus: first query shortened to %.1f s of samples", self._first_range)

    def range_s(self) -> float:
        """How far back the next query reads: to the oldest cursor of the nodes last seen
        (each needs its previous scrape to take a delta) plus RANGE_MARGIN_S; at most
        lookback_s. A node
        absent longer than that loses the window across its gap, as an agent whose ring
        wrapped does."""
        lookback = self.settings.lookback_s
        if self._newest is None or self._oldest_cursor is None:
            return min(lookback, self._first_range)
        now = time.time()
        # By our clock (exact when the clocks agree: covers how old the newest sample
        # already was when it arrived), and by Prometheus's (our clock running behind).
        behind = max(now - self._oldest_cursor,
                     self._newest - self._oldest_cursor + now - self._newest_wall)
        return min(lookback, max(0.0, behind) + RANGE_MARGIN_S)

    def _failed(self, result: PullResult, error: str) -> None:
        error = printable(error, 300)  # Prometheus's own words (an error body): no terminal escapes
        if error != self._last_error:
            log.info("prometheus query failing: %s", error)
            self._last_error = error
        for cursor in self.cursors.values():
            cursor.failures += 1
            cursor.last_error = error
        result.failed = max(1, len(self.cursors))

    def _forget(self, now: float) -> None:
        horizon = FORGET_AFTER_WINDOWS * self.store.horizon_s
        for key in [k for k, c in self.cursors.items() if c.last_ok is not None and now - c.last_ok > horizon]:
            del self.cursors[key]

    def _decode(self, body: bytes) -> ParsedAnswer:
        doc = bounded_json.loads(body, max_bytes=self.settings.max_response_bytes, what="prometheus answer")
        return parse_answer(doc, max_series=self.settings.max_series)

    async def _query(self) -> bytes:
        """GET /api/v1/query; the body is read up to max_response_bytes, never more."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.settings.query_timeout_s))
        limit = self.settings.max_response_bytes
        url = f"{self.settings.url}/api/v1/query"
        async with self._session.get(url, params={"query": query_for(self.range_s(), self.settings.selector)}) as resp:
            if resp.content_length is not None and resp.content_length > limit:
                raise PromAnswerTooLarge(f"answer of {resp.content_length} bytes, over prometheus.max_response_bytes")
            body = bytearray()
            async for chunk in resp.content.iter_chunked(1 << 16):
                body += chunk
                if len(body) > limit:
                    raise PromAnswerTooLarge(f"answer over prometheus.max_response_bytes ({limit})")
            if resp.status != 200:
                # Prometheus explains a bad query in the JSON body; show its first words.
                raise PromAnswerError(f"HTTP {resp.status}: {bytes(body[:200]).decode(errors='replace')}")
        return bytes(body)
