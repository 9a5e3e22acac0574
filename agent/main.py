"""`azprobe agent`: load the probe once, turn its maps into windows every interval, serve them.

The loop is one thread: it drains the event ring buffer until the next interval boundary, then
reads the maps (tick). `on_ready` runs once the probe is loaded and the HTTP server is
listening, `on_tick` after every successful tick: hooks for systemd's sd_notify.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import click

from azprobe.agent.httpserver.tlsserve import ServerTls
from azprobe.agent.config import (DEFAULT_MAX_HOSTS, DEFAULT_RTT_SAMPLE_TICKS, MAX_HOSTS_LIMIT, AgentConfig,
                                  load_agent_config, running_config)
from azprobe.agent.events import EventLog
from azprobe.agent.http import BearerToken, make_server, serve_in_background
from azprobe.agent.lpm import AzRegistry, address_key, trie_entries
from azprobe.agent.probe import Probe
from azprobe.agent.sockdiag import SockDiagCollector
from azprobe.agent.utilisation import UtilisationSampler
from azprobe.agent.windows import (BPF_COUNTER_FIELDS, Snapshot, WindowRing, host_stats, newest_within, path_id,
                                   path_stats, snapshot_delta, split_path)
from azprobe.daemon import sdnotify
from azprobe.daemon.address_file import format_host_port, write_address_file
from azprobe.config import parse_host_port
from azprobe.errors import ConfigError, PrerequisiteError
from azprobe.contracts.sketch import Histogram
from azprobe.contracts.window import HISTOGRAM_FIELDS, MAX_WINDOW_S, Utilisation, Window

log = logging.getLogger("azprobe.agent")

HEALTHY_AFTER_INTERVALS = 3


def window_start(prev_end: float, end: float) -> float:
    """Where a window ending at `end` starts. It may span MAX_WINDOW_S at most, or every
    reader refuses it and all its counts are lost: after a clock step, a suspend or an
    hour of failed reads, the counts since the last window go into one that spans the limit."""
    start = max(prev_end, end - MAX_WINDOW_S)
    if start > prev_end:
        log.warning("%.0f s since the last window (clock step, suspend or failed reads): this one holds their "
                    "counts and spans %.0f s, the most a window may", end - prev_end, MAX_WINDOW_S)
    return start


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
        # Cumulative latency histograms per path, summed from the windows: /metrics.
        self._hist_totals: dict[tuple[str, str], dict[str, Histogram]] = {}
        self._latest_util: Utilisation | None = None
        self.events = EventLog()
        self._server = None
        self._bearer = BearerToken(config.token)  # what /v1/* requests must carry; a reload sets the new one
        self.tls: ServerTls | None = None  # [agent.tls], built at start
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------
    @property
    def probe(self) -> Probe:
        if self._probe is None:
            raise RuntimeError("agent not started")
        return self._probe

    @property
    def bound_address(self) -> tuple[str, int]:
        """(host, port) the HTTP server listens on (the real port when listen asked for 0)."""
        host, port = self._server.server_address[:2] if self._server else self.listen
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.bound_address
        scheme = "https" if self.config.tls else "http"
        return f"{scheme}://{format_host_port('127.0.0.1' if host in ('0.0.0.0', '') else host, port)}"

    def start(self) -> None:
        if self._probe is None:
            self._probe = load_collector(self.config.collector, self.config.rtt_sample_ticks, self.config.max_hosts)
        self._apply(self.config)
        self.probe.open_events(lambda event: self.events.record(event, self.registry.name_of))
        # Counts from before this start (another agent sharing the probe, or a previous
        # run) are history, not this boot's first window.
        # HTTPS: a bad certificate or a key others may read is a config error now (exit 2).
        self.tls = ServerTls(self.config.tls, self.config.client_identity) if self.config.tls else None
        self._prev = self.probe.snapshot(self._rtt_paths())
        self._prev_end = time.time()
        self._last_tick = time.monotonic()
        try:
            self._server = make_server(self.listen[0], self.listen[1], self, token=self._bearer,
                                       tls=self.tls)
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
        """Re-read the config file: refill the LPM trie, take the token file's token; the
        fields of agent.config.RESTART_FIELDS run on. A bad file keeps the running config."""
        if self.config_path is None:
            return False
        old = self.config
        try:
            new, restart = running_config(old, load_agent_config(self.config_path))
            with self._lock:
                self._apply(new)
        except Exception as exc:  # noqa: BLE001 - whatever a reload meets, the running agent goes on
            log.error("reload of %s failed, keeping the old topology and token: %r", self.config_path, exc)
            return False
        self._bearer.set(new.token)  # rotation without a restart: the next request is checked against it
        log.info("reloaded topology: %s", ", ".join(sorted(new.topology)))
        if self.tls is not None:  # the same files, re-read: SIGHUP also says "the certificate changed"
            self.tls.reload()
        log_reload(self.probe, old, new, restart)
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
            end = max(time.time(), self._prev_end)
            start = window_start(self._prev_end, end)
            self._seq += 1
            window = Window(node=self.config.node, az=self.config.az, boot_id=self.boot_id,
                            seq=self._seq, start=start, end=end,
                            util=self._util.sample(), paths=path_stats(delta, self.registry.name_of),
                            lost_events=delta.lost_events,
                            source=getattr(self.probe, "source", "bpf"),
                            hosts=host_stats(delta, self.registry.name_of), hosts_dropped=delta.hosts_dropped)
            self._prev, self._prev_end = snap, window.end
            for path, values in delta.counters.items():
                src, dst = split_path(path)
                key = (self.registry.name_of(src), self.registry.name_of(dst))
                self._totals.setdefault(key, Counter()).update(values)
            for p in window.paths:
                if p.rtt_us.counts or p.connect_us.counts:
                    hists = self._hist_totals.setdefault((p.src, p.dst), {n: Histogram() for n in HISTOGRAM_FIELDS})
                    hists["rtt_us"].merge(p.rtt_us)
                    hists["connect_us"].merge(p.connect_us)
            self._latest_util = window.util
            self.ring.append(window)
            self._last_tick = time.monotonic()
            self.events.log_interval(window.seq)
        if self.on_tick:
            self.on_tick(window)
        return window

    # -- what the HTTP server reads (agent.http.ServedState) ---------------------------
    def _header(self) -> dict:
        return {"node": self.config.node, "az": self.config.az, "boot_id": self.boot_id}

    def windows_page(self, after: int) -> tuple[dict[str, str], list[Window]]:
        # Host summaries make windows up to ~100x larger: a reader catching up from an
        # old seq gets the newest windows that fit (config.MAX_HOSTS_LIMIT), not 1 MiB+.
        return self._header(), newest_within(self.ring.after(after), MAX_HOSTS_LIMIT)

    def events_doc(self, after: int) -> dict:
        return {**self._header(), "events": self.events.after(after)}

    def healthy(self) -> tuple[bool, str]:
        age = time.monotonic() - self._last_tick
        limit = HEALTHY_AFTER_INTERVALS * self.config.interval_s
        if age <= limit:
            return True, f"ok: last read {age:.2f}s ago"
        return False, f"stale: last read {age:.2f}s ago (limit {limit:.1f}s)"

    def path_totals(self) -> dict[tuple[str, str], dict[str, int]]:
        with self._lock:
            return {k: {n: v.get(n, 0) for n in BPF_COUNTER_FIELDS} for k, v in self._totals.items()}

    def path_histograms(self) -> dict[tuple[str, str], dict[str, Histogram]]:
        with self._lock:
            return {k: {n: Histogram(h.counts) for n, h in v.items()} for k, v in self._hist_totals.items()}

    def identity(self) -> dict[str, str]:
        return self._header()

    def latest_util(self) -> Utilisation | None:
        return self._latest_util

    def event_totals(self) -> dict[str, int]:
        return self.events.totals()

    def program_stats(self) -> dict[str, tuple[int, int]]:
        return self.probe.program_stats()

    def gauges(self) -> dict[str, float]:
        """The agent's scalars for /metrics: a key ending in `_total` is a count since
        start (a counter), any other a gauge (names and help: azprobe.contracts.prom)."""
        latest = self.ring.latest()
        return {
            "window_seq": float(latest.seq if latest else 0),
            "lost_events_total": float(self.probe.lost_events),
            # Connects with no slot to track their outcome (BPF probe only; 0: sock_diag).
            "untracked_connects_total": float(getattr(self.probe, "untracked_connects", 0)),
            # Handler runs the kernel skipped, their counts lost (BPF probe only; 0: sock_diag).
            "handler_misses_total": float(getattr(self.probe, "handler_misses", 0)),
            # Host summaries not kept: the probe's host table was full (0: sock_diag).
            "hosts_dropped_total": float(getattr(self.probe, "hosts_dropped", 0)),
            "topology_prefixes": float(sum(len(n) for n in self.config.topology.values())),
            # The BPF probe's RTT sampling (docs/probe.md); 0: the sock_diag sampler.
            "rtt_sample_ticks": float(getattr(self.probe, "rtt_sample_ticks", 0)),
            # 1: the BPF probe hooks BTF-typed tracepoints; 0: classic ones, or sock_diag.
            "btf_hooks": float(getattr(self.probe, "hooks", "") == "btf"),
        }


def log_reload(probe: object, old: AgentConfig, new: AgentConfig, restart: str) -> None:
    """What a reload did not apply, and a token that changed (never the token itself)."""
    if restart:
        log.warning("%s", restart)
    if new.token != old.token:
        log.info("reload: agent.token_file read: /v1/* requests need its token from now on"
                 if new.token else "reload: no agent.token_file: /v1/* is served without a token")
    running = getattr(probe, "rtt_sample_ticks", None)  # the sock_diag sampler has none
    if running is not None and new.rtt_sample_ticks != running:
        log.warning("[agent] rtt_sample_ticks = %d applies at the next start: the loaded probe keeps %d",
                    new.rtt_sample_ticks, running)
    table = getattr(probe, "max_hosts", None)
    if table is not None and new.max_hosts != table:
        log.warning("[agent] max_hosts = %d applies at the next start: the loaded probe keeps %d",
                    new.max_hosts, table)


def load_collector(kind: str, rtt_sample_ticks: int = DEFAULT_RTT_SAMPLE_TICKS,
                   max_hosts: int = DEFAULT_MAX_HOSTS) -> Probe | SockDiagCollector:
    """The collector `[agent] collector` names: "bpf", "sockdiag", or "auto" (the BPF
    probe, else the sock_diag sampler, with one log line saying why)."""
    if kind == "sockdiag":
        log.info("collector: sockdiag (configured)")
        return SockDiagCollector()
    if kind == "bpf":
        return Probe.load(rtt_sample_ticks, max_hosts=max_hosts)
    try:
        return Probe.load(rtt_sample_ticks, max_hosts=max_hosts)
    except PrerequisiteError as exc:
        log.warning("collector: falling back to sockdiag (socket sampling, no per-segment RTT or "
                    "connect events) because the BPF probe cannot load: %s", exc)
        return SockDiagCollector()


@click.command("agent")
@click.option("--config", "config_path", required=True, help="Agent TOML config file.")
@click.option("--listen", default=None, help="host:port for HTTP (overrides agent.listen; port 0: any free port).")
@click.option("--address-file", default=None, type=click.Path(dir_okay=False),
              help="Once serving, write the bound host:port here (for listen port 0).")
@click.option("--collector", type=click.Choice(["auto", "bpf", "sockdiag"]), default=None,
              help="Override [agent] collector: the BPF probe, the sock_diag sampler, or auto.")
def agent_command(config_path: str, listen: str | None, address_file: str | None, collector: str | None) -> None:
    """Run the node agent: load the probe, serve per-path windows."""
    config = load_agent_config(config_path)
    if collector:
        config = dataclasses.replace(config, collector=collector)
    listen_addr = parse_host_port(listen, "--listen", listen=True) if listen else None
    # systemd Type=notify: READY once loaded and serving, WATCHDOG=1 from the loop's ticks.
    notifier = sdnotify.LoopNotifier(lambda: f"serving {agent.url}, window seq {agent.gauges()['window_seq']:.0f}",
                                     loop_interval_s=config.interval_s)

    def ready() -> None:
        if address_file:
            write_address_file(address_file, *agent.bound_address)
        notifier.started()

    agent = Agent(config, config_path=config_path, listen=listen_addr,
                  on_ready=ready, on_tick=lambda window: notifier.tick())
    try:
        agent.run_forever()
    finally:
        notifier.stopping()
