"""A real Prometheus server (Debian's `prometheus` binary) as a child process, for the
lab and the tests: its own config and data dir in a work dir, loopback only, a short
scrape interval. Stopped by pid (ManagedProcess), never by name."""

from __future__ import annotations

import json
import shutil
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import psutil

from azprobe.config import parse_host_port
from azprobe.dev.demo.processes import ManagedProcess
from azprobe.errors import PrerequisiteError

JOB = "azprobe-agent"


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        raise PrerequisiteError("prometheus: not installed; run `make setup` (Debian package `prometheus`)")
    return path


def scrape_config(targets: Sequence[str], scrape_interval_s: float, rule_files: Sequence[str] = ()) -> str:
    """prometheus.yml scraping `targets` (host:port) as job azprobe-agent. JSON is YAML."""
    interval = f"{int(scrape_interval_s * 1000)}ms"
    doc = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "rule_files": list(rule_files),
        "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": list(targets)}]}],
    }
    return json.dumps(doc, indent=2)


class PrometheusServer:
    """`with PrometheusServer(work_dir, ["127.0.0.1:9740"]) as prom:` ... prom.url."""

    def __init__(self, work_dir: Path, targets: Sequence[str], *, scrape_interval_s: float = 1.0,
                 rule_files: Sequence[str] = ()) -> None:
        for target in targets:
            parse_host_port(target, "prometheus target")
        self.work_dir = Path(work_dir)
        self.targets = list(targets)
        self.scrape_interval_s = scrape_interval_s
        self.rule_files = list(rule_files)
        self.port = 0
        self.proc: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_timeout_s: float = 60.0) -> "PrometheusServer":
        self.work_dir.mkdir(parents=True, exist_ok=True)
        config = self.work_dir / "prometheus.yml"
        config.write_text(scrape_config(self.targets, self.scrape_interval_s, self.rule_files))
        # Port 0: Prometheus binds a free port itself (no find-then-release race); the port
        # it got is read from its listening socket.
        argv = [prometheus_binary(), f"--config.file={config}", f"--storage.tsdb.path={self.work_dir / 'data'}",
                "--web.listen-address=127.0.0.1:0", "--storage.tsdb.retention.time=1h",
                "--log.level=warn"]
        self.proc = ManagedProcess("prometheus", argv, self.work_dir / "prometheus.log").start()
        deadline = time.monotonic() + ready_timeout_s
        while not (self.port or self._bound_port()) or not self._ready():
            self.proc.check_alive()
            if time.monotonic() > deadline:
                raise PrerequisiteError(f"prometheus not ready within {ready_timeout_s:.0f} s; "
                                        f"see {self.proc.log_path}")
            time.sleep(0.1)
        return self

    def _bound_port(self) -> int:
        """The port of the server's listening socket, once it has one (0 before)."""
        assert self.proc is not None and self.proc.pid is not None
        try:
            listening = [c.laddr.port for c in psutil.Process(self.proc.pid).net_connections("tcp")
                         if c.status == psutil.CONN_LISTEN and c.laddr.ip == "127.0.0.1"]
        except psutil.Error:
            return 0
        self.port = min(listening, default=0)
        return self.port

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False

    def api(self, path: str, **params: str) -> dict:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=5) as resp:
            return json.load(resp)

    def targets_up(self) -> bool:
        """Every target scraped successfully at least once."""
        active = self.api("/api/v1/targets")["data"]["activeTargets"]
        return len(active) == len(self.targets) and all(t["health"] == "up" for t in active)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def __enter__(self) -> "PrometheusServer":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
