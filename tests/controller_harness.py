"""Run `azprobe controller` as a real subprocess for integration tests.

ControllerProcess writes a TOML config, starts `python -m azprobe.commands.cli controller
--config FILE --address-file FILE` (what the `azprobe` console script runs) listening on
127.0.0.1 port 0, and gives tests its /healthz, /metrics and log on the port the
controller reports it bound (no free-port race). Always used as a context manager, so the process is killed even when
the test fails.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import consul

from azprobe.daemon.address_file import read_address_file
from azprobe.config import dump_toml
from azprobe.contracts.weights import WeightsDoc, parse_weights
from azprobe.controller.topology import Topology, TopologySettings

ROOT = Path(__file__).resolve().parent.parent


AZS = ("az-a", "az-b", "az-c")  # the fake agents' AZs
SESSION_TTL_S = 10.0  # the harness's controllers (Consul's minimum)


def topology(azs: tuple[str, ...] = AZS) -> Topology:
    """The controller's AZ filter for a Collector built by a test."""
    return Topology(TopologySettings(azs=azs))


def controller_config(name: str, consul_url: str, agents: list[str], *,
                      interval_s: float = 0.2, evaluation_window_s: float = 1.0, lock_delay_s: float = 1.0,
                      safety: dict[str, Any] | None = None, azs: tuple[str, ...] = AZS) -> dict[str, Any]:
    return {
        "controller": {"name": name, "interval_s": interval_s, "evaluation_window_s": evaluation_window_s,
                       # port 0: the kernel picks; advertise port 0 = the port bound
                       "listen": "127.0.0.1:0", "advertise": "127.0.0.1:0",
                       "session_ttl_s": SESSION_TTL_S, "lock_delay_s": lock_delay_s},
        "consul": {"address": consul_url, "prefix": "azprobe/v1/"},
        "agents": {"static": agents, "pull_timeout_s": 0.5},
        "safety": {"min_samples": 20, "stale_after_s": 2, "equal_after_s": 4, "heartbeat_s": 30,
                   "drain_dwell_s": 0, **(safety or {})},
        "topology": {"azs": list(azs)},
    }


class ControllerProcess:
    def __init__(self, tmp_path: Path, config: dict[str, Any]) -> None:
        self.name = config["controller"]["name"]
        self.config = config
        self.config_path = tmp_path / f"{self.name}.toml"
        self.log_path = tmp_path / f"{self.name}.log"
        self.address_path = tmp_path / f"{self.name}.address"
        self._port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def make(cls, tmp_path: Path, name: str, consul_url: str, agents: list[str], **kwargs: Any) -> "ControllerProcess":
        return cls(tmp_path, controller_config(name, consul_url, agents, **kwargs))

    def start(self) -> "ControllerProcess":
        self.config_path.write_text(dump_toml(self.config))
        self.address_path.unlink(missing_ok=True)  # a restart reports its own port
        self._port = None
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "azprobe.commands.cli", "controller", "--config",
                                      str(self.config_path), "--address-file", str(self.address_path)],
                                     cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        return self

    @property
    def port(self) -> int | None:
        """The port the controller bound; None until it serves (tests poll get/healthz)."""
        if self._port is None:
            address = read_address_file(self.address_path)
            self._port = address[1] if address else None
        return self._port

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def get(self, path: str) -> bytes | None:
        if self.port is None:
            return None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as resp:
                return resp.read()
        except (urllib.error.URLError, OSError):
            return None

    def healthz(self) -> dict[str, Any] | None:
        body = self.get("/healthz")
        return json.loads(body) if body else None

    def metric(self, name: str, **labels: str) -> float | None:
        """The value of one sample from /metrics (None when absent)."""
        body = self.get("/metrics")
        if body is None:
            return None
        want = ",".join(sorted(f'{k}="{v}"' for k, v in labels.items()))
        for line in body.decode().splitlines():
            if line.startswith("#"):
                continue
            key, _, value = line.rpartition(" ")
            sample, _, label_text = key.partition("{")
            if sample != name:
                continue
            got = ",".join(sorted(label_text.rstrip("}").split(","))) if label_text else ""
            if got == want:
                return float(value)
        return None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> "ControllerProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()


def read_weights(client: consul.Consul, key: str = "azprobe/v1/weights") -> WeightsDoc | None:
    _, data = client.kv.get(key)
    if not data or not data.get("Value"):
        return None
    return parse_weights(data["Value"])


def leader_holder(client: consul.Consul, key: str = "azprobe/v1/leader") -> dict[str, Any] | None:
    """{"name", "address", "session"} of the lock holder, or None when the lock is free."""
    _, data = client.kv.get(key)
    if not data or not data.get("Session"):
        return None
    return {**json.loads(data["Value"]), "session": data["Session"]}


def fleet_controller(consul_url: str, urls: list[str], prefix: str, azs: list[str]) -> Any:
    """An in-process Controller for a fake-agent fleet: 0.2 s cycles over a 2 s window, no
    lock delay, a 1 s drain dwell, pulling `urls` and publishing under `prefix`."""
    from azprobe.controller.config import parse_config
    from azprobe.controller.main import Controller

    return Controller(parse_config({
        "controller": {"name": "ctl", "listen": "127.0.0.1:9", "interval_s": 0.2, "evaluation_window_s": 2.0,
                       "lock_delay_s": 0},
        "consul": {"address": consul_url, "prefix": prefix},
        "agents": {"static": urls},
        "topology": {"azs": azs},
        "safety": {"drain_dwell_s": 1.0},
    }))


def drive_rounds(ctl: Any, agents: Any, read: Any = None, *, rounds: int, step_s: float = 0.2,
                 before_pull: Any = None, loop: Any = None, simulated_clock: bool = True) -> list:
    """Run a Controller (controller.main) round by round: every agent emits a window,
    `before_pull(i)` runs on the controller's loop, one cycle, one Consul round (driven, so
    nothing waits on a timer), then `read()`'s result is kept; returns those results.
    simulated_clock: the decision clock steps `step_s` a round instead of reading the
    wall. On `loop` (an event loop the caller keeps, and closes the collector on) rounds
    can follow later rounds; without one the collector is closed at the end."""
    import asyncio
    import time

    results = []
    clock = [time.time()]
    if simulated_clock:
        ctl.decider.wall = ctl.consul.wall = lambda: clock[0]

    async def run() -> None:
        for i in range(rounds):
            for agent in agents:
                agent.emit(interval_s=step_s)
            if before_pull:
                before_pull(i)
            await ctl.cycle()
            await asyncio.to_thread(ctl.consul_tick)
            if read is not None:
                results.append(read())
            clock[0] += step_s
        if loop is None:
            await ctl.collector.close()

    if loop is None:
        asyncio.run(run())
    else:
        loop.run_until_complete(run())
    return results
