"""`[agents] source = "prometheus"`: read agents' windows from a Prometheus-compatible
query API instead of pulling the agents (docs/prometheus.md).

Each cycle sends one instant query for raw samples (controller.prom_windows.query_for),
turns each node's new scrape pairs into windows and stores them in the same WindowStore
the direct pull fills. The first query reads the whole `lookback_s` (the backlog, as a
first pull reads an agent's ring); later ones read only back to the oldest cursor of the
nodes last seen, plus a margin: decoding the answer is most of the cost, and a 30 s
lookback at 1 s scrapes would re-read 30 samples per series for the 1-2 new ones. From there on, merge, the
detector, quorum, safety and the KV output are the direct path's code, untouched.

A hostile or overloaded Prometheus costs the event loop nothing but the socket reads:
the answer is decoded as it streams in, series by series, in one worker thread
(AnswerStream), bounded in bytes (max_response_bytes, counted while reading), in series
(max_series, counted while decoding) and per series (MAX_SERIES_CHARS), and the whole
query - reading, decoding, turning series into windows - is bounded by query_timeout_s.
A cycle waits for the answer at most `cycle_budget_s`; an answer still being read then
is picked up by a later cycle, and no second query is sent meanwhile (pull_overruns).

A `WindowSource` (controller/window_source.py), as the direct pull's Collector is, so
the controller picks one or the other.
A node is an AgentCursor keyed "instance/node"; its `newest_end` is the scrape timestamp
of the last window read, so overlapping lookbacks never count a scrape twice.

A scrape target (its target labels) speaks for one node, as a URL does for the direct
pull, by the same rule (controller/collect.py's Identities): a target is named by its
first accepted answer, and a name belongs to one target until it has been silent for the
forget time. A name two targets claim in one answer stays with the one that held it; if
neither did, it goes to neither: which one comes first in sort order proves nothing.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import logging
import re
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import aiohttp

from azprobe.contracts import bounded_json
from azprobe.contracts.window import Window, printable
from azprobe.controller.collect import FORGET_AFTER_WINDOWS as IDENTITY_FORGET_WINDOWS
from azprobe.controller.collect import Identities
from azprobe.controller.window_source import (AgentCursor, AgentState, AgentTarget, CollectCounters, PullResult,
                                              count_states)
from azprobe.controller.window_store import WindowStore
from azprobe.controller.config import AgentsSettings, PrometheusSettings
from azprobe.controller.prom_auth import PromAuth, describe
from azprobe.controller.topology import Topology
from azprobe.controller.prom_windows import (MAX_SERIES_CHARS, AnswerBuilder, NodeRead, ParsedAnswer,
                                             PromAnswerError, PromAnswerTooLarge, answer_windows, check_envelope,
                                             query_for)

T = TypeVar("T")
log = logging.getLogger(__name__)

FORGET_AFTER_WINDOWS = 10  # a node absent this many evaluation windows is forgotten
RANGE_MARGIN_S = 1.5  # clock skew and a scrape in flight
MIN_RANGE_S = 1.0
FEED_BYTES = 256 << 10  # the answer goes to the decoding thread in pieces of this size
ERROR_BODY_BYTES = 4096  # of a non-200 answer, read for its message
REFUSED_LOG_EVERY_S = 60.0  # targets refused every cycle are logged this often


class PrometheusCollector:
    """Windows from Prometheus, one synthetic window per node per scrape interval."""

    def __init__(self, settings: PrometheusSettings, *, evaluation_window_s: float, stale_after_s: float,
                 topology: Topology,
                 clock: Callable[[], float] = time.monotonic, cycle_budget_s: float | None = None) -> None:
        self.settings = settings
        self.cycle_budget_s = cycle_budget_s  # None: a cycle waits for its answer (query_timeout_s at most)
        self.topology = topology  # the controller's AZs, as for the direct pull
        self.stale_after_s = stale_after_s
        self.clock = clock
        self.store = WindowStore(evaluation_window_s)
        self.cursors: dict[str, AgentCursor] = {}
        self.counters = CollectCounters()
        self.speakers = TargetSpeakers(IDENTITY_FORGET_WINDOWS * self.store.horizon_s)  # as the direct pull forgets
        self._newest: float | None = None  # newest sample in the last answer (Prometheus clock)
        self._newest_wall = 0.0  # our wall clock when that answer arrived
        self._oldest_cursor: float | None = None  # oldest cursor among the nodes in that answer
        self._new: list[Window] = []
        self._session: aiohttp.ClientSession | None = None
        self._last_error = ""
        self._first_range = settings.lookback_s  # halved while the first answer is too large or slow
        self._in_flight: asyncio.Task[tuple[ParsedAnswer, dict[str, NodeRead]]] | None = None
        self._worker: ThreadPoolExecutor | None = None  # decodes answers: one thread, one answer at a time
        self._auth = PromAuth(settings)  # its files are read now: a bad one is a ConfigError at start

    # --- the WindowSource surface ------------------------------------------------------
    def set_targets(self, targets: Iterable[AgentTarget]) -> None:
        """Targets are Prometheus's business (its service discovery); nothing to do."""

    def take_new(self) -> list[Window]:
        new, self._new = self._new, []
        return new

    def agent_states(self, now: float | None = None) -> dict[AgentState, int]:
        """Each node's state, by the direct pull's rule (AgentCursor.state)."""
        return count_states(self.cursors.values(), self.clock() if now is None else now, self.stale_after_s)

    def apply_settings(self, agents: AgentsSettings, *, stale_after_s: float, interval_s: float) -> None:
        """A reload: the agents' state rule. [agents]' pull settings mean nothing here."""
        self.stale_after_s = stale_after_s

    async def close(self) -> None:
        if self._in_flight is not None:
            self._in_flight.cancel()
            await asyncio.gather(self._in_flight, return_exceptions=True)
            self._in_flight = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._worker is not None:
            self._worker.shutdown(wait=False, cancel_futures=True)
            self._worker = None

    # --- one cycle ------------------------------------------------------------------
    async def pull_all(self) -> PullResult:
        started = self.clock()
        result = PullResult()
        if self._in_flight is None:
            cursors = {key: c.newest_end for key, c in self.cursors.items()}
            self._in_flight = asyncio.create_task(self._answer(cursors))
        else:  # the previous answer is still being read: wait on it, never a second query
            self.counters.pull_overruns += 1
        await asyncio.wait({self._in_flight}, timeout=self.cycle_budget_s)
        if self._in_flight.done():
            done, self._in_flight = self._in_flight, None
            self._settle(done, result)
        now = self.clock()
        self.store.prune(now)
        self._forget(now)
        result.states = {s.value: n for s, n in self.agent_states(now).items()}
        result.duration_s = now - started
        return result

    def _settle(self, done: asyncio.Task[tuple[ParsedAnswer, dict[str, NodeRead]]], result: PullResult) -> None:
        error = done.exception()
        if error is None:
            answer, reads = done.result()
            if self._last_error:
                log.info("prometheus answers again")
                self._last_error = ""
            self.counters.windows_garbage += answer.garbage_series
            result.ingested = self.ingest(answer, self.clock(), reads)
            self._remember_position(answer)
            return
        # The traceback runs through asyncio.timeout back to the task that holds it: a
        # reference cycle, kept (with the series read so far) until a full collection,
        # which the controller runs rarely (gcpace.pace_gc). Cut it; the message is enough.
        _drop_tracebacks(error)
        if isinstance(error, TimeoutError):
            self._failed(result, f"query timeout after {self.settings.query_timeout_s}s")
            self.counters.pull_timeouts += 1
            self._shrink_range()
        elif isinstance(error, PromAnswerTooLarge):
            self._failed(result, str(error))
            self.counters.pull_errors += 1
            self._shrink_range()
        elif isinstance(error, (aiohttp.ClientError, OSError, ValueError, RecursionError)):  # PromAnswerError too
            self._failed(result, describe(error))
            self.counters.pull_errors += 1
        else:
            raise error

    def ingest(self, answer: ParsedAnswer, now: float, reads: Mapping[str, NodeRead] | None = None) -> int:
        """Store every node's windows newer than its cursor; returns windows stored.
        `reads`: the nodes' windows, built off the event loop from the cursors at query
        time (absent: built here, from the cursors now)."""
        if reads is None:
            reads = answer_windows(answer, {key: c.newest_end for key, c in self.cursors.items()},
                                   self.store.horizon_s)
        stored = 0
        speakers = self.speakers.accepted(answer, now, self.counters)  # the others are refused
        for key, series in ((k, s) for k, s in answer.nodes.items() if k in speakers):
            # Ages by the node's own newest scrape, as the direct pull ages an agent's
            # windows by its own newest: one node's odd clock cannot age the others'.
            newest = max(series.info) if series.info else None
            cursor = self.cursors.get(key)
            if cursor is None:
                cursor = self.cursors[key] = AgentCursor(AgentTarget(url=f"prometheus:{key}", node=series.node))
            read = reads[key]
            windows = read.windows
            self.counters.windows_garbage += read.garbage
            self.counters.windows_too_old += read.too_old
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
            # the store's node name per agent too, or target churn grows it for ever
            self.store.forget_agent(self.cursors.pop(key).target.url)
        self.speakers.identities.prune(now)

    async def _answer(self, cursors: Mapping[str, float | None]) -> tuple[ParsedAnswer, dict[str, NodeRead]]:
        """One query read, decoded and turned into windows, all within query_timeout_s; the
        decoding in the worker thread, so the event loop only moves bytes."""
        timeout = self.settings.query_timeout_s
        deadline = time.monotonic() + timeout
        async with asyncio.timeout(timeout):
            answer = await self._query()
            reads = await self._off_loop(answer_windows, answer, cursors, self.store.horizon_s, deadline)
        return answer, reads

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prometheus-decode")
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    async def _query(self) -> ParsedAnswer:
        """GET /api/v1/query; the body is read up to max_response_bytes, never more, and
        decoded as it arrives."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.settings.query_timeout_s))
        url = f"{self.settings.url}/api/v1/query"
        stream = AnswerStream(self.settings.max_series)
        try:
            return await self._read(url, stream)
        finally:
            # An answer refused halfway is freed now, not at the next full GC; in the
            # worker, after the piece it may still be decoding.
            if self._worker is not None:
                self._worker.submit(stream.discard)

    async def _read(self, url: str, stream: AnswerStream) -> ParsedAnswer:
        limit = self.settings.max_response_bytes
        async with self._session.get(url, params={"query": query_for(self.range_s(), self.settings.selector)},
                                     **self._auth.request_kwargs()) as resp:
            if resp.content_length is not None and resp.content_length > limit:
                raise PromAnswerTooLarge(f"answer of {resp.content_length} bytes, over prometheus.max_response_bytes")
            if resp.status != 200:
                body = bytearray()
                async for chunk in resp.content.iter_chunked(ERROR_BODY_BYTES):
                    body += chunk
                    if len(body) >= ERROR_BODY_BYTES:
                        break
                # Prometheus explains a bad query in the JSON body; show its first words.
                raise PromAnswerError(f"HTTP {resp.status}: {bytes(body[:200]).decode(errors='replace')}")
            read, pending = 0, bytearray()
            async for chunk in resp.content.iter_chunked(FEED_BYTES):
                read += len(chunk)
                if read > limit:
                    raise PromAnswerTooLarge(f"answer over prometheus.max_response_bytes ({limit})")
                pending += chunk
                if len(pending) >= FEED_BYTES:
                    await self._off_loop(stream.feed, bytes(pending))
                    pending.clear()
            if pending:
                await self._off_loop(stream.feed, bytes(pending))
        return await self._off_loop(stream.close)


class TargetSpeakers:
    """Which scrape target speaks for which node (the direct pull's Identities, a target
    in a URL's place); a name two targets claim in one answer stays with its holder or
    goes to neither."""

    def __init__(self, forget_after_s: float) -> None:
        self.identities = Identities(forget_after_s)
        self._logged_at = float("-inf")

    def accepted(self, answer: ParsedAnswer, now: float, counters: CollectCounters) -> set[str]:
        """The keys of the answer whose target may speak for its node; the others are
        refused, counted and logged (at most once a minute)."""
        claimants: dict[str, list[str]] = {}
        for key, series in answer.nodes.items():
            claimants.setdefault(series.node, []).append(key)
        accepted: set[str] = set()
        problems: list[str] = []
        for node, keys in sorted(claimants.items()):
            if len(keys) > 1:
                # Only a target that already speaks for the name keeps it (the claim
                # below refreshes its hold); when none does, all are refused.
                keys = [k for k in keys if self.identities.node_of(_speaker(answer, k)) == node] or keys
                if len(keys) > 1:
                    problems.append(f"node {printable(node, 40)!r} is claimed by {len(keys)} targets, none of "
                                    "which spoke for it before: taken from none (narrow prometheus.selector "
                                    "to one job or replica)")
                    continue
            (key,) = keys
            problem = self.identities.claim(_speaker(answer, key), node, now)
            if problem:
                problems.append(f"target {printable(answer.nodes[key].target, 200)} {problem}")
            else:
                accepted.add(key)
        refused = len(answer.nodes) - len(accepted)
        counters.answers_refused += refused
        if (problems or answer.refused_targets) and now - self._logged_at >= REFUSED_LOG_EVERY_S:
            self._logged_at = now
            if problems:
                log.info("prometheus: %d node series refused (one target speaks for one node): %s%s", refused,
                         problems[0], f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
            if answer.refused_targets:
                log.info("prometheus: %d scrape targets refused whole: their series carry more than one node name",
                         answer.refused_targets)
        return accepted


def _speaker(answer: ParsedAnswer, key: str) -> str:
    return f"prometheus:{answer.nodes[key].target}"


def _drop_tracebacks(error: BaseException) -> None:
    seen: set[int] = set()
    stack: list[BaseException | None] = [error]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        stack += [e.__context__, e.__cause__]


_JSON = json.JSONDecoder(parse_int=bounded_json.int_parser("prometheus answer"))
_SPACE = re.compile(r"[ \t\n\r]*")
_SCALAR_END = re.compile(r"[ \t\n\r,\]}]")


def decode_json_value(text: str, start: int) -> tuple[object, int]:
    """The Prometheus source's one JSON decoder: the value that starts at text[start] (one
    series, one envelope field), and where it ends. ValueError when no whole value starts
    there (broken, or not all of it has arrived yet); JsonRefused (a ValueError) when it
    nests too deeply. The envelope is parsed by AnswerStream itself, so only a series can
    nest, and the C scanner's own recursion guard is that series' bound: it refuses the
    value as an ordinary JsonRefused, never a RecursionError out of the source."""
    try:
        return _JSON.raw_decode(text, start)
    except RecursionError:
        raise bounded_json.JsonRefused("prometheus answer: JSON nested too deeply") from None


class AnswerStream:
    """An /api/v1/query answer parsed while it arrives: `feed` each piece of the body in
    order, then `close`. Only the envelope (`{"status": ..., "data": {"resultType": ...,
    "result": [...]}}`) is parsed here, token by token; each value in it (each series of
    the result) is cut out whole and decoded alone by decode_json_value, then handed to
    AnswerBuilder, which refuses the answer at the series past max_series. So the memory
    is the unparsed tail (at most MAX_SERIES_CHARS plus a piece) and the series kept, never
    the body or its decoded tree. Values other than status, error, errorType, resultType
    are decoded (bounded the same) and dropped."""

    def __init__(self, max_series: int) -> None:
        self.builder = AnswerBuilder(max_series)
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._text = ""  # the unparsed tail of the body
        self._pos = 0
        self._eof = False
        self._envelope: dict[str, object] = {}
        self._data: dict[str, object] = {}
        self._parser: Generator[None, None, None] | None = self._document()
        self._done = False

    def feed(self, piece: bytes) -> None:
        self._text = self._text[self._pos:] + self._utf8.decode(piece)
        self._pos = 0
        self._resume()

    def close(self) -> ParsedAnswer:
        self._text = self._text[self._pos:] + self._utf8.decode(b"", final=True)
        self._pos = 0
        self._eof = True
        self._resume()
        check_envelope(self._envelope)
        return self.builder.finish()

    def discard(self) -> None:
        """Drop the parser and what it holds. A parser stopped halfway is a reference
        cycle (its generator's frame holds the stream), which the controller's rare full
        collections (gcpace.pace_gc) would keep, and the series read so far with it."""
        if self._parser is not None:
            self._parser.close()
            self._parser = None
        self._text = ""
        self.builder = AnswerBuilder(self.builder.max_series)

    def _resume(self) -> None:
        if not self._done:
            assert self._parser is not None, "fed after discard()"
            try:
                next(self._parser)
                return  # waiting for more of the body
            except StopIteration:
                self._done = True
        self._pos = _SPACE.match(self._text, self._pos).end()
        if self._pos < len(self._text):
            raise PromAnswerError(f"not JSON: extra data after the answer ({self._text[self._pos:][:20]!r})")

    # Each step below is a generator: it yields when it needs more of the body, and the
    # next feed() resumes it where it stopped.
    def _char(self) -> Generator[None, None, str]:
        """The next character that is not white space (not consumed)."""
        while True:
            self._pos = _SPACE.match(self._text, self._pos).end()
            if self._pos < len(self._text):
                return self._text[self._pos]
            if self._eof:
                raise PromAnswerError("not JSON: the answer ends early")
            yield

    def _expect(self, chars: str) -> Generator[None, None, str]:
        c = yield from self._char()
        if c not in chars:
            raise PromAnswerError(f"not JSON: expected {' or '.join(repr(x) for x in chars)}, found {c!r}")
        self._pos += 1
        return c

    def _value(self) -> Generator[None, None, object]:
        """One whole value, decoded; waits until all of it has arrived."""
        first = yield from self._char()
        container = first in '{["'  # whole once it decodes: it ends in its closing character
        while True:
            start, text = self._pos, self._text
            m = None if container else _SCALAR_END.search(text, start)  # a number or literal ends at one
            if container or m is not None or self._eof:
                try:
                    value, end = decode_json_value(text, start)
                except bounded_json.JsonRefused as exc:
                    raise PromAnswerError(str(exc)) from None
                except ValueError as exc:
                    if not container or self._eof:
                        raise PromAnswerError(f"not JSON: {exc}") from None
                else:
                    if not container and end != (m.start() if m else len(text)):
                        raise PromAnswerError(f"not JSON: {text[start:start + 20]!r}")
                    if end - start > MAX_SERIES_CHARS:
                        break
                    self._pos = end
                    return value
            if len(text) - start > MAX_SERIES_CHARS:
                break
            yield
        raise PromAnswerTooLarge(f"one series or value over {MAX_SERIES_CHARS} characters (or not JSON)")

    def _object(self, member: Callable[[str], Generator[None, None, None]]) -> Generator[None, None, None]:
        """The members of an object whose '{' is consumed, each key handed to `member`."""
        if (yield from self._char()) == "}":
            self._pos += 1
            return
        while True:
            key = yield from self._value()
            if not isinstance(key, str):
                raise PromAnswerError("not JSON: an object key is not a string")
            yield from self._expect(":")
            yield from member(key)
            if (yield from self._expect(",}")) == "}":
                return

    def _document(self) -> Generator[None, None, None]:
        yield from self._expect("{")
        yield from self._object(self._envelope_member)

    def _envelope_member(self, key: str) -> Generator[None, None, None]:
        if key == "data" and (yield from self._char()) == "{":
            self._pos += 1
            self._envelope["data"] = self._data
            yield from self._object(self._data_member)
            return
        value = yield from self._value()
        if key in ("status", "error", "errorType", "data"):
            self._envelope[key] = value

    def _data_member(self, key: str) -> Generator[None, None, None]:
        if key == "result" and (yield from self._char()) == "[":
            self._pos += 1
            self._data["result"] = []  # a list; its series went to the builder
            if (yield from self._char()) == "]":
                self._pos += 1
                return
            while True:
                self.builder.add((yield from self._value()))
                if (yield from self._expect(",]")) == "]":
                    return
        value = yield from self._value()
        if key in ("resultType", "result"):
            self._data[key] = value
