"""`azprobe agent`: load the probe once, turn its maps into windows every interval, serve them.

The loop is one thread: it drains the perf buffer until the next interval boundary, then
reads the maps (tick). `on_ready` runs once the probe is loaded and the HTTP server is
listening, `on_tick` after every successful tick: hooks for systemd's sd_notify.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path

import click

from azprobe.agent.config import AgentConfig, load_agent_config
from azprobe.agent.http import make_server, serve_in_background
from azprobe.agent.lpm import AzRegistry, address_key, trie_entries
from azprobe.agent.probe import Probe, ProbeEvent
from azprobe.agent.util import UtilisationSampler
from azprobe.agent.windows import Snapshot, WindowRing, path_id, path_stats, snapshot_delta, split_path
from azprobe import sdnotify
from azprobe.config import parse_host_port
from azprobe.errors import ConfigError, PrerequisiteError
from azprobe.contracts.window import COUNTER_FIELDS, Window

log = logging.getLogger("azprobe.agent")

EVENT_RING_SIZE = 1000
HEALTHY_AFTER_INTERVALS = 3


class Agent:
    def __init__(self, config: AgentConfig, *, config_path: str | Path | None = None,
                 listen: tuple[str, int] | None = None, probe: Probe | None = None,
                 on_ready: Callable[[], None] | None = None,
                 on_tick: Callable[[Window], None] | None = None) -> None:
        self.config = config
        self.config_path = Path(config_path) if config_path else None
        self.listen = listen or config.listen
        self.boot_id = str(uuid.uuid4())
        self.on_ready = on_ready
        self.on_tick = on_tick
        self.registry = AzRegistry()
        self.ring = WindowRing(config.ring_size)
        self._probe = probe
        self._owns_probe = probe is None
        self._util = UtilisationSampler()
        self._lock = threading.Lock()  # tick vs reload vs HTTP readers of totals
        self._stop = threading.Event()
        self._reload_requested = threading.Event()
        self._seq = 0
        self._prev = Snapshot()
        self._prev_end = time.time()
        self._last_tick = 0.0
        self._totals: dict[tuple[str, str], Counter] = {}
        self._events: deque[dict] = deque(maxlen=EVENT_RING_SIZE)
        self._event_id = 0
        self._event_totals: Counter = Counter()
        self._interval_events: Counter = Counter()
        self._server = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------
    @property
    def probe(self) -> Probe:
        if self._probe is None:
            raise RuntimeError("agent not started")
        return self._probe

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2] if self._server else self.listen
        return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"

    def start(self) -> None:
        if self._probe is None:
            self._probe = Probe.load()
        self._apply(self.config)
        self.probe.open_events(self._record_event)
        # Counts from before this start (another agent sharing the probe, or a previous
        # run) are history, not this boot's first window.
        self._prev = self.probe.snapshot(self._rtt_paths())
        self._prev_end = time.time()
        self._last_tick = time.monotonic()
        try:
            self._server = make_server(self.listen[0], self.listen[1], self)
        except OSError as exc:
            raise PrerequisiteError(f"agent.listen {self.listen[0]}:{self.listen[1]}: {exc.strerror}; "
                                    "pass --listen with a free address") from None
        serve_in_background(self._server)
        self._thread = threading.Thread(target=self._loop, name="agent-loop", daemon=True)
        self._thread.start()
        log.info("agent %s (az %s) serving on %s, boot_id %s, sockets of %s", self.config.node, self.config.az,
                 self.url, self.boot_id,
                 ", ".join(map(str, self.config.addresses)) if self.config.addresses else "every local address")
        if self.on_ready:
            self.on_ready()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        if self._server:
            self._server.shutdown()
            self._server.server_close()
        if self._owns_probe and self._probe is not None:
            self._probe.close()

    def run_forever(self) -> None:
        """CLI entry: signals drive reload (SIGHUP) and shutdown (SIGTERM, SIGINT)."""
        signal.signal(signal.SIGHUP, lambda *_: self.request_reload())
        signal.signal(signal.SIGTERM, lambda *_: self._stop.set())
        signal.signal(signal.SIGINT, lambda *_: self._stop.set())
        self.start()
        try:
            while not self._stop.wait(1.0):
                if self._thread and not self._thread.is_alive():
                    raise PrerequisiteError("agent read loop died; see the log above")
        finally:
            self.stop()

    # -- topology ------------------------------------------------------------------
    def _apply(self, config: AgentConfig) -> None:
        ids = self.registry.assign(config.topology)
        # Before the topology: set_topology forgets cached flows, also other nodes' ones.
        self.probe.set_node_addresses([address_key(a) for a in config.addresses])
        self.probe.set_topology(trie_entries(config.topology, ids), ids[config.az])
        self.config = config

    def _rtt_paths(self) -> list[int]:
        # RTT is only recorded between AZs of the topology (ids ever assigned: sockets
        # opened before a reload keep their path).
        ids = sorted(self.registry.names)
        return [path_id(src, dst) for src in ids for dst in ids]

    def request_reload(self) -> None:
        """Signal-safe: the loop thread reloads at its next wakeup."""
        self._reload_requested.set()

    def reload(self) -> bool:
        """Re-read the config file and refill the LPM trie; a bad file keeps the old one."""
        if self.config_path is None:
            return False
        try:
            new = load_agent_config(self.config_path)
            with self._lock:
                self._apply(new)
        except ConfigError as exc:
            log.error("reload of %s failed, keeping the old topology: %s", self.config_path, exc)
            return False
        log.info("reloaded topology: %s", ", ".join(sorted(new.topology)))
        return True

    # -- the loop ------------------------------------------------------------------
    def _loop(self) -> None:
        next_tick = time.monotonic() + self.config.interval_s
        while not self._stop.is_set():
            if self._reload_requested.is_set():
                self._reload_requested.clear()
                self.reload()
            remaining = next_tick - time.monotonic()
            if remaining > 0:
                self.probe.poll_events(min(remaining, 0.25) * 1000)
                continue
            try:
                self.tick()
            except Exception:  # keep serving the ring; /healthz turns 503 if this repeats
                log.exception("reading the probe failed")
            next_tick += self.config.interval_s
            if next_tick < time.monotonic():  # fell behind (suspend, overload): don't burst
                next_tick = time.monotonic() + self.config.interval_s

    def tick(self) -> Window:
        """Read the maps once and append the window of deltas since the previous tick."""
        with self._lock:
            snap = self.probe.snapshot(self._rtt_paths())
            delta = snapshot_delta(snap, self._prev)
            end = time.time()
            self._seq += 1
            window = Window(node=self.config.node, az=self.config.az, boot_id=self.boot_id,
                            seq=self._seq, start=self._prev_end, end=max(end, self._prev_end),
                            util=self._util.sample(), paths=path_stats(delta, self.registry.name_of),
                            lost_events=delta.lost_events)
            self._prev, self._prev_end = snap, window.end
            for path, values in delta.counters.items():
                src, dst = split_path(path)
                key = (self.registry.name_of(src), self.registry.name_of(dst))
                self._totals.setdefault(key, Counter()).update(values)
            self.ring.append(window)
            self._last_tick = time.monotonic()
            if self._interval_events:
                log.info("events seq %d: %s", window.seq,
                         " ".join(f"{k}={n}" for k, n in sorted(self._interval_events.items())))
                self._interval_events.clear()
        if self.on_tick:
            self.on_tick(window)
        return window

    def _record_event(self, event: ProbeEvent) -> None:
        wall = time.time() - (time.monotonic_ns() - event.ts_ns) / 1e9
        self._event_id += 1
        self._events.append({
            "id": self._event_id, "ts": round(wall, 6), "kind": event.kind,
            "src": self.registry.name_of(event.src_az_id), "dst": self.registry.name_of(event.dst_az_id),
            "saddr": event.saddr, "sport": event.sport, "daddr": event.daddr, "dport": event.dport,
        })
        self._event_totals[event.kind] += 1
        self._interval_events[event.kind] += 1
        log.debug("event %s", self._events[-1])

    # -- what the HTTP server reads (agent.http.AgentState) ---------------------------
    def _header(self) -> dict:
        return {"node": self.config.node, "az": self.config.az, "boot_id": self.boot_id}

    def windows_doc(self, after: int) -> dict:
        return {**self._header(), "windows": [w.to_json() for w in self.ring.after(after)]}

    def events_doc(self, after: int) -> dict:
        events = [e for e in list(self._events) if e["id"] > after]
        return {**self._header(), "events": events}

    def healthy(self) -> tuple[bool, str]:
        age = time.monotonic() - self._last_tick
        limit = HEALTHY_AFTER_INTERVALS * self.config.interval_s
        if age <= limit:
            return True, f"ok: last read {age:.2f}s ago"
        return False, f"stale: last read {age:.2f}s ago (limit {limit:.1f}s)"

    def path_totals(self) -> dict[tuple[str, str], dict[str, int]]:
        with self._lock:
            return {k: {n: v.get(n, 0) for n in COUNTER_FIELDS + ("syn_rto",)} for k, v in self._totals.items()}

    def event_totals(self) -> dict[str, int]:
        return dict(self._event_totals)

    def program_stats(self) -> dict[str, tuple[int, int]]:
        return self.probe.program_stats()

    def gauges(self) -> dict[str, float]:
        latest = self.ring.latest()
        return {
            "window_seq": float(latest.seq if latest else 0),
            "lost_events_total": float(self.probe.lost_events),
            "topology_prefixes": float(sum(len(n) for n in self.config.topology.values())),
        }


@click.command("agent")
@click.option("--config", "config_path", required=True, help="Agent TOML config file.")
@click.option("--listen", default=None, help="host:port for HTTP (overrides agent.listen).")
def agent_command(config_path: str, listen: str | None) -> None:
    """Run the node agent: load the probe, serve per-path windows."""
    config = load_agent_config(config_path)
    listen_addr = parse_host_port(listen, "--listen") if listen else None
    # systemd Type=notify: READY once loaded and serving, WATCHDOG=1 from the loop's ticks.
    notifier = sdnotify.LoopNotifier(lambda: f"serving {agent.url}, window seq {agent.gauges()['window_seq']:.0f}",
                                     loop_interval_s=config.interval_s)
    agent = Agent(config, config_path=config_path, listen=listen_addr,
                  on_ready=notifier.started, on_tick=lambda window: notifier.tick())
    try:
        agent.run_forever()
    finally:
        notifier.stopping()
