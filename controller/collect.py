"""Pull windows from every agent, once per cycle, without double counting anything.

Each agent serves `GET <base>/v1/windows?after=SEQ` (docs/contracts.md "Window document"). Per agent we keep a
cursor (boot_id, last seq): a new boot_id means the agent restarted, so its old cursor
means nothing and we re-read the new boot from seq 0; a jump past last seq + 1 means the
agent's ring dropped windows we never saw (a gap: counted, and we take what is there);
a seq we already hold is a duplicate and ignored; a window that fails parse_window is
garbage: counted and ignored. Pulls run concurrently with a per-request timeout and a
cycle budget, so a slow or dead agent costs one timeout, never the cycle.

Identity (docs/quorum.md "Identity"): a URL is one vantage point, named by its first
valid answer (`Identities`). An answer without a node name, one under another name than
the URL's, or one naming a node another URL speaks for is refused and counted; a name
changes hands only once its speaker has been silent for the forget time. A window whose
node differs from its answer's is garbage. The store keeps at most one window per
(node, end): an agent replaying its ring under a new boot_id every pull adds nothing the
second time; and at most `node_window_cap` windows per node, so one agent cannot flood
it. Every window passes the controller's topology filter (controller/topology.py)
before it is stored. With [agents.tls] an answer must also come with a certificate that
may speak for the node it names (controller/agent_identity.py), else it is refused whole.

The store (controller/window_store.py) keeps the windows of the evaluation window, keyed
(node, end); each is stamped with the controller's clock *shifted by the window's age on
the agent's own clock*: agent clocks may be skewed, and a backlog a new leader reads from
a ring must not count as fresh.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from azprobe.clients.agent import pull_answer
from azprobe.clients.transport import MAX_BODY_BYTES, AgentHttpClient, Endpoint
from azprobe.contracts.window import MIN_INTERVAL_S, Window, WindowError, printable
from azprobe.contracts.windowcodec import PendingWindow, WindowsPage, page_from_doc
from azprobe.controller.agent_identity import AgentGuard
from azprobe.controller.config import AgentsSettings
from azprobe.controller.topology import Topology
from azprobe.controller.window_source import (AgentCursor, AgentState, AgentTarget, CollectCounters, PullResult,
                                              count_states, pull_budget)
from azprobe.controller.window_store import WindowStore

log = logging.getLogger(__name__)
T = TypeVar("T")

RESTART_LOG_EVERY_S = 60.0
# Windows an agent may make while its answer is on the way, beyond those the controller's
# clock allows since the last answer: one pull timeout at the fastest interval, and more.
GAP_SLACK_WINDOWS = 600
FORGET_AFTER_WINDOWS = 3  # the default forget time ([agents] forget_after_s), in evaluation windows


class AnswerRefused(WindowError):
    """An answer the collector does not take from this URL (identity, docs/quorum.md)."""


class Identities:
    """Which agent URL speaks for which node name. A URL is named by its first accepted
    answer and a name belongs to one URL at a time: one agent cannot speak for its
    neighbours, nor rotate through their names. A name changes hands (a real rename, a
    reused address, a node now reached by another URL) only once it has been silent for
    `forget_after_s`: by then its windows have left the evaluation window."""

    def __init__(self, forget_after_s: float) -> None:
        self.forget_after_s = forget_after_s
        self._speaker: dict[str, tuple[str, float]] = {}  # node -> (URL, clock of its last accepted answer)
        self._name: dict[str, str] = {}  # URL -> node; the inverse of _speaker

    def claim(self, url: str, node: str, now: float) -> str:
        """Record that `url` answered as `node` at `now`: "" when it may, else why not."""
        bound = self._name.get(url)
        if bound is not None and bound != node:
            if now - self._speaker[bound][1] < self.forget_after_s:
                return (f"answers as node {printable(node, 40)!r} but speaks for {printable(bound, 40)!r}: "
                        f"a new name is taken once the old one has been silent for {self.forget_after_s:g} s")
            self._release(bound)
        holder = self._speaker.get(node)
        if holder is not None and holder[0] != url:
            if now - holder[1] < self.forget_after_s:
                return (f"answers as node {printable(node, 40)!r}, which {printable(holder[0], 200)} speaks for: "
                        f"one URL per node")
            self._release(node)
        self._speaker[node] = (url, now)
        self._name[url] = node
        return ""

    def node_of(self, url: str) -> str | None:
        return self._name.get(url)

    def prune(self, now: float) -> None:
        """Forget names silent for the forget time (memory stays one entry per live URL)."""
        for node in [n for n, (_, at) in self._speaker.items() if now - at >= self.forget_after_s]:
            self._release(node)

    def _release(self, node: str) -> None:
        url, _ = self._speaker.pop(node)
        if self._name.get(url) == node:
            del self._name[url]


class Collector:
    """Owns the agents' cursors and the window store. One instance per controller."""

    def __init__(
        self,
        *,
        evaluation_window_s: float,
        pull_timeout_s: float,
        stale_after_s: float,
        topology: Topology,
        cycle_budget_s: float | None = None,
        concurrency: int = 128,
        clock: Callable[[], float] = time.monotonic,
        token: str = "",
        max_body_bytes: int = MAX_BODY_BYTES,
        forget_after_s: float | None = None,
        guard: AgentGuard | None = None,
    ) -> None:
        self.topology = topology
        self.pull_timeout_s = pull_timeout_s
        self.stale_after_s = stale_after_s
        # However many agents time out, the pull phase ends by this budget.
        self.cycle_budget_s = cycle_budget_s if cycle_budget_s is not None else max(pull_timeout_s * 2, 1.0)
        self.concurrency = concurrency
        self.clock = clock
        self.store = WindowStore(evaluation_window_s)
        self.identities = Identities(self._forget_time(forget_after_s))
        self.cursors: dict[str, AgentCursor] = {}
        self.counters = CollectCounters()
        self._new: list[Window] = []  # stored since the last take_new(): the detector's input
        self.token = token  # sent as a bearer token to agents that require one
        self.guard = guard or AgentGuard(None, "")  # [agents.tls]: which node an answer may speak for
        self._http = AgentHttpClient(max_idle_per_host=concurrency, max_body_bytes=max_body_bytes,
                                     user_agent="azprobe-controller", ssl_context=self.guard.context,
                                     server_name=self.guard.server_name)
        self._endpoints: dict[str, Endpoint] = {}

    def _forget_time(self, forget_after_s: float | None) -> float:
        return forget_after_s if forget_after_s is not None else FORGET_AFTER_WINDOWS * self.store.horizon_s

    def apply_settings(self, agents: AgentsSettings, *, stale_after_s: float, interval_s: float) -> None:
        """A reload: the pulls' bounds, the token and the times, from the next pull on."""
        self.pull_timeout_s = agents.pull_timeout_s
        self.cycle_budget_s = pull_budget(agents.pull_timeout_s, interval_s)
        self.concurrency = agents.concurrency
        self._http.max_idle_per_host = agents.concurrency
        self._http.max_body_bytes = agents.max_body_bytes
        self.token = agents.token
        self.guard.apply(agents.tls, agents.identity)
        self._http.server_name = self.guard.server_name
        self.stale_after_s = stale_after_s
        self.identities.forget_after_s = self._forget_time(agents.forget_after_s)

    # --- targets -------------------------------------------------------------------
    def set_targets(self, targets: Iterable[AgentTarget]) -> None:
        """Replace the agent list (static or from discovery); known agents keep their cursors."""
        wanted = {t.url: t for t in targets}
        for url in list(self.cursors):
            if url not in wanted:
                del self.cursors[url]
                self._endpoints.pop(url, None)
                self.store.forget_agent(url)
        for url, target in wanted.items():
            cursor = self.cursors.get(url)
            if cursor is None:
                self.cursors[url] = AgentCursor(target)
            else:
                cursor.target = target

    def agent_states(self, now: float | None = None) -> dict[AgentState, int]:
        return count_states(self.cursors.values(), self.clock() if now is None else now, self.stale_after_s)

    # --- ingest (pure given a response body; unit-tested without HTTP) ---------------
    def needs_repull(self, cursor: AgentCursor, body: WindowsPage | dict) -> bool:
        """A new boot_id answering `after=N>0` may have hidden seqs 1..N of the new boot."""
        boot_id = body.boot_id if isinstance(body, WindowsPage) else body.get("boot_id")
        return cursor.boot_id is not None and boot_id != cursor.boot_id and cursor.last_seq > 0

    def ingest(self, cursor: AgentCursor, body: WindowsPage | object, now: float) -> int:
        """Apply one /v1/windows response (a decoded page, or a JSON document) to the
        cursor and the store; returns windows stored. Raises AnswerRefused (counted) for
        an answer this URL may not give, leaving the cursor as it was."""
        page = body if isinstance(body, WindowsPage) else page_from_doc(body)
        self._check_identity(cursor, page, now)
        self._follow_boot(cursor, page.boot_id, now)
        cursor.node = page.node
        cursor.az = page.az or cursor.az
        fresh, skipped_seqs, newest_end = admit_page(page, self._unread(cursor, page), cursor, self.store, self.topology,
                                                      self.counters)
        read = seqs_read(fresh, skipped_seqs)
        count_gaps(cursor, read, self.counters, now)
        if read and read[-1] > cursor.last_seq:
            cursor.last_seq = read[-1]
        if newest_end is not None:
            cursor.newest_end = newest_end
        stored = self._store(cursor, fresh, newest_end, now)
        self.counters.windows_ingested += stored
        if stored:
            cursor.last_new_window = now
        return stored

    def _check_identity(self, cursor: AgentCursor, page: WindowsPage, now: float) -> None:
        """A URL speaks for one node, the one its answers name (Identities)."""
        problem = "answers without a node name" if not page.node else \
            self.identities.claim(cursor.target.url, page.node, now)
        if problem:
            self.counters.answers_refused += 1
            raise AnswerRefused(f"answer refused: {problem}")

    def _follow_boot(self, cursor: AgentCursor, boot_id: str, now: float) -> None:
        if cursor.boot_id is not None and boot_id != cursor.boot_id:
            # The agent restarted: the old boot's windows stay where they are (already
            # counted once); the new boot starts a fresh cursor.
            self.counters.agent_restarts += 1
            if now - cursor.restart_logged_at >= RESTART_LOG_EVERY_S:
                cursor.restart_logged_at = now
                log.info("agent %s restarted (boot %s -> %s)", printable(cursor.target.url, 200),
                         printable(cursor.boot_id, 40), printable(boot_id, 40))
            cursor.last_seq = 0
            cursor.newest_end = None
        cursor.boot_id = boot_id

    def _unread(self, cursor: AgentCursor, page: WindowsPage) -> list[PendingWindow]:
        """The page's windows past the cursor; a seq already read is a duplicate."""
        unread = []
        for pending in page.windows:
            if pending.seq is not None and pending.seq <= cursor.last_seq:
                self.counters.windows_duplicate += 1
            else:
                unread.append(pending)
        return unread

    def _store(self, cursor: AgentCursor, fresh: list[Window], newest_end: float | None, now: float) -> int:
        """Stamp each window by its age on the agent's clock and store it; returns windows stored."""
        stored = 0
        for w in fresh:
            age = max(0.0, (newest_end if newest_end is not None else w.end) - w.end)
            if self.store.add(cursor.target.url, w, now - age):
                self._new.append(w)
                stored += 1
            else:  # this node's window for this `end` is already held (another URL, a new boot_id)
                self.counters.windows_duplicate += 1
        return stored

    def take_new(self) -> list[Window]:
        """Windows stored since the last call (each is returned exactly once)."""
        new, self._new = self._new, []
        return new

    # --- HTTP -------------------------------------------------------------------------
    def _endpoint(self, url: str) -> Endpoint:
        return self._endpoints.get(url) or self._endpoints.setdefault(url, Endpoint.parse(url))

    async def _fetch(self, url: str, after: int) -> WindowsPage:
        """A page whose certificate may speak for the node it names (AgentGuard)."""
        page, peer = await pull_answer(self._http, self._endpoint(url), after, token=self.token,
                                       timeout_s=self.pull_timeout_s)
        problem = self.guard.check(url, peer, page.node)
        if problem:
            raise AnswerRefused(problem)
        return page

    async def _pull_one(self, cursor: AgentCursor) -> int:
        """Pull one agent; -1 when the pull failed (the cursor says why)."""
        url = cursor.target.url
        try:
            body = await self._fetch(url, cursor.last_seq)
            if self.needs_repull(cursor, body):
                body = await self._fetch(url, 0)
            stored = self.ingest(cursor, body, self.clock())
        except asyncio.CancelledError:
            self._mark_failed(cursor, "pull cut by the cycle budget")
            self.counters.pull_timeouts += 1
            raise
        except (asyncio.TimeoutError, TimeoutError):
            self._mark_failed(cursor, f"timeout after {self.pull_timeout_s}s")
            self.counters.pull_timeouts += 1
            return -1
        except AnswerRefused as refused:  # counted by ingest, or by the guard
            self._mark_failed(cursor, str(refused))
            return -1
        except Exception as exc:  # refused, reset, HttpError, bad JSON; a bug here costs this pull, not the worker
            if not isinstance(exc, (OSError, ValueError, TypeError, KeyError)) and not cursor.failures:
                log.error("agent %s: reading its answer failed", printable(url, 200), exc_info=True)
            self._mark_failed(cursor, self.guard.describe(url, exc))
            self.counters.pull_errors += 1
            return -1
        if cursor.failures:
            log.info("agent %s answers again", printable(url, 200))
        cursor.failures = 0
        cursor.last_error = ""
        cursor.last_ok = self.clock()
        return stored

    def _mark_failed(self, cursor: AgentCursor, error: str) -> None:
        if not cursor.failures:
            log.info("agent %s failing: %s", printable(cursor.target.url, 200), printable(error, 200))
        cursor.failures += 1
        cursor.last_error = error

    async def pull_all(self) -> PullResult:
        """Pull every agent once, `concurrency` at a time; returns by the cycle budget
        whatever happens (agents not reached by then count as failed this cycle)."""
        started = self.clock()
        result = PullResult()
        self.guard.new_cycle()
        # Windows that left the evaluation window make room under each node's cap first.
        self.store.prune(started)
        # Least recently pulled first: when the budget cuts a cycle short, the agents it
        # did not reach go first next time instead of being starved every cycle.
        cursors = sorted(self.cursors.values(), key=lambda c: c.last_attempt)

        async def pull(cursor: AgentCursor) -> None:
            cursor.last_attempt = started
            n = await self._pull_one(cursor)
            if n < 0:
                result.failed += 1
            else:
                result.ingested += n

        unreached, cut = await work_within(self.cycle_budget_s, cursors, pull, min(self.concurrency, len(cursors)))
        result.failed += cut + len(unreached)  # cut: the pulls in flight when the budget ran out
        for cursor in unreached:
            self._mark_failed(cursor, "not reached within the cycle budget")
        now = self.clock()
        self.store.prune(now)
        self.identities.prune(now)
        result.states = {s.value: n for s, n in self.agent_states(now).items()}
        result.duration_s = now - started
        return result

    async def close(self) -> None:
        self._http.close()


async def work_within(budget_s: float, jobs: Iterable[T], work: Callable[[T], Awaitable[None]],
                      workers: int) -> tuple[list[T], int]:
    """`work` on each of `jobs` in order, `workers` at a time, for at most `budget_s`;
    returns the jobs never started and how many were cut in flight. A fixed pool of
    workers rather than a task per job: at 5,000 agents the task churn alone costs a tenth
    of the cycle. A job's own timeout starts when it starts, not while it waits.

    The budget stops the pool by a flag as well as by cancelling it: asyncio.wait_for
    (Python 3.11) swallows a cancellation that meets the completion of what it waits for,
    and the worker would go on through the rest of the jobs, for seconds past the budget
    when thousands of TLS handshakes are completing (a full reconnect)."""
    queue = iter(jobs)
    unstarted: list[T] = []
    cut = 0
    over = False

    async def worker() -> None:
        nonlocal cut
        for job in queue:
            if over:
                unstarted.append(job)
                return
            try:
                await work(job)
            except asyncio.CancelledError:
                cut += 1
                raise

    tasks = [asyncio.create_task(worker()) for _ in range(workers)]
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=budget_s)
        over = True
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    return unstarted + list(queue), cut


def admit_page(page: WindowsPage, candidates: list[PendingWindow], cursor: AgentCursor, store: WindowStore,
               topology: Topology, counters: CollectCounters) -> tuple[list[Window], set[int], float | None]:
    """The windows to store, the seqs read but not stored (garbage, too old, over the
    node's cap: not gaps), and the newest `end` of a valid window (the agent's clock).

    Newest first, so that the age reference comes only from windows that validated
    (one window ending at +inf cannot age every later one out), and so that when the
    node's cap leaves room for a few, the newest are kept. The cheap filters (too old
    by the agent's own clock, no room left) run before the costly validation."""
    room = store.room(page.node)
    newest_end = cursor.newest_end
    fresh: list[Window] = []
    skipped_seqs: set[int] = set()
    if len(candidates) > 1:  # one window a pull is the steady state: no sort for it
        candidates.sort(key=lambda p: -p.end if p.end is not None else math.inf)
    for pending in candidates:
        seq, end = pending.seq, pending.end
        if seq is not None and end is not None and newest_end is not None \
                and newest_end - end > store.horizon_s:
            counters.windows_too_old += 1
            skipped_seqs.add(seq)
            continue
        if room <= 0:
            counters.windows_over_cap += 1
            if seq is not None:
                skipped_seqs.add(seq)
            continue
        try:
            window = pending.parse()
            if window.boot_id != page.boot_id:
                raise WindowError(f"boot_id: {printable(window.boot_id, 40)!r} differs from the response's "
                                  f"{printable(page.boot_id, 40)!r}")
            if window.node != page.node:  # one response speaks for one node
                raise WindowError(f"node: {printable(window.node, 40)!r} differs from the response's "
                                  f"{printable(page.node, 40)!r}")
        except WindowError as exc:
            counters.windows_garbage += 1
            log.debug("garbage window from %s: %s", printable(cursor.target.url, 200), exc)
            # Step past it when its seq is readable, so it is not re-read every cycle.
            if seq is not None:
                skipped_seqs.add(seq)
            continue
        if newest_end is None or window.end > newest_end:
            newest_end = window.end
        admitted = topology.admit(window)
        if admitted is None:
            if seq is not None:
                skipped_seqs.add(seq)
            continue
        fresh.append(admitted)
        room -= 1
    return fresh, skipped_seqs, newest_end


def seqs_read(fresh: list[Window], skipped_seqs: set[int]) -> list[int]:
    """The seqs read from a page, stored or skipped, ascending; sorts `fresh` by seq (the
    order they are stored in). One window a pull is the steady state: no sort, no set for it."""
    if len(fresh) > 1:
        fresh.sort(key=lambda w: w.seq)
    if not skipped_seqs:
        return [w.seq for w in fresh]
    return sorted(skipped_seqs.union([w.seq for w in fresh]))


def count_gaps(cursor: AgentCursor, read: list[int], counters: CollectCounters, now: float) -> None:
    """A gap: the ring no longer holds seqs we never read (`read`: seqs_read's). On first
    contact (or a new boot) we take what the ring has on purpose, so a first seq > 1 is not a gap.
    A gap counts at most the windows the agent could have made since its last answer
    (gap_bound): the seq is the agent's word, and one jump to 2^53 would be a fleet's
    figure of lost windows for good."""
    expected = cursor.last_seq + 1
    bound = gap_bound(cursor, now)
    for i, seq in enumerate(read):
        if seq > expected and (i > 0 or cursor.last_seq > 0):
            counters.gap_events += 1
            counters.gap_windows += min(seq - expected, bound)
        expected = seq + 1


def gap_bound(cursor: AgentCursor, now: float) -> int:
    """The most windows an agent can have made since its last answer: one per
    MIN_INTERVAL_S of the controller's clock, and GAP_SLACK_WINDOWS."""
    since = 0.0 if cursor.last_ok is None else max(0.0, now - cursor.last_ok)
    return int(since / MIN_INTERVAL_S) + GAP_SLACK_WINDOWS
