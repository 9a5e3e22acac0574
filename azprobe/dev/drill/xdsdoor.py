"""The drill's xDS door: one `azprobe xds serve` on the host for one mode, listening on
a unix socket in the mode's work dir. A path-named unix socket is reachable from every
network namespace, so Envoy and the gRPC client inside a lab client namespace reach it
without a route out of the lab."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from azprobe.config import dump_toml
from azprobe.dev.demo.processes import ManagedProcess, azprobe_argv
from azprobe.errors import PrerequisiteError


@dataclass
class XdsDoor:
    work_dir: Path
    consul_url: str
    prefix: str
    endpoints: dict[str, list[str]]  # AZ -> ["ip:port"]
    zones: list[str]
    service: str = "backend"
    process: ManagedProcess | None = None

    @property
    def socket(self) -> Path:
        return self.work_dir / "xds.sock"

    def start(self, timeout_s: float = 20.0) -> "XdsDoor":
        self.work_dir.mkdir(parents=True, exist_ok=True)
        eps = self.work_dir / f"{self.service}-endpoints.json"
        eps.write_text(json.dumps(self.endpoints))
        config = self.work_dir / "xds.toml"
        config.write_text(dump_toml({
            "xds": {"listen": f"unix:{self.socket}", "metrics_listen": "", "zones": self.zones, "drain_s": 0.5},
            "consul": {"address": self.consul_url, "prefix": self.prefix},
        }) + f'\n[[service]]\nname = "{self.service}"\nendpoints_file = "{eps}"\n')
        self.socket.unlink(missing_ok=True)
        ready = self.work_dir / "xds.address"
        ready.unlink(missing_ok=True)
        self.process = ManagedProcess("xds", azprobe_argv("-v", "xds", "serve", "--config", str(config),
                                                          "--address-file", str(ready)),
                                      self.work_dir / "xds.log")
        self.process.start()
        deadline = time.monotonic() + timeout_s
        while not ready.exists():
            if not self.process.alive():
                raise PrerequisiteError(f"azprobe xds exited before serving; see {self.process.log_path}")
            if time.monotonic() > deadline:
                raise PrerequisiteError(f"azprobe xds did not serve within {timeout_s:g} s; "
                                        f"see {self.process.log_path}")
            time.sleep(0.05)
        return self

    def check_alive(self) -> None:
        if self.process is not None:
            self.process.check_alive()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
