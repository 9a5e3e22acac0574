"""DevConsul: run a real devconsul subprocess for tests, demos and benchmarks.

    with DevConsul(data_dir=tmp_path) as dc:
        consul.Consul(host=dc.host, port=dc.port)
        dc.kill(); dc.start()          # crash + restart on the same port and data dir

It starts `python -m azprobe.dev.devconsul` (exactly what `azprobe devconsul` runs) on a free
127.0.0.1 port and returns once /v1/status/leader answers, so a test never races the
server's startup.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DevConsul:
    def __init__(self, data_dir: str | Path | None = None, acl_master_token: str | None = None,
                 port: int | None = None, node_name: str = "devconsul-test",
                 start_timeout: float = 15.0, max_conns_per_client: int = 512) -> None:
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.acl_master_token = acl_master_token  # passed in the environment, never on argv
        # above the 200 of Consul (and the CLI default): tests park 200 watchers and still ask /v1/devconsul/debug
        self.max_conns_per_client = max_conns_per_client
        self.node_name = node_name
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def http_addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "devconsul is not running"
        return self.proc.pid

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "azprobe.dev.devconsul", "--http-addr", self.http_addr,
               "--node-name", self.node_name]
        if self.data_dir is not None:
            cmd += ["--data-dir", str(self.data_dir)]
        cmd += ["--max-conns-per-client", str(self.max_conns_per_client)]
        return cmd

    def start(self) -> "DevConsul":
        if self.proc is not None and self.proc.poll() is None:
            return self
        log_fd, log_name = _tempfile()
        self._log_path = Path(log_name)
        env = dict(os.environ)
        env.pop("CONSUL_HTTP_TOKEN", None)
        env.pop("DEVCONSUL_ACL_MASTER_TOKEN", None)
        if self.acl_master_token:
            env["DEVCONSUL_ACL_MASTER_TOKEN"] = self.acl_master_token
        self.proc = subprocess.Popen(self.command(), stdout=log_fd, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)
        os.close(log_fd)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"devconsul exited with {self.proc.returncode}: {self.output()}")
            if self._leader_answers():
                return self
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"devconsul did not answer on {self.url} within {self.start_timeout}s: {self.output()}")

    def _leader_answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/v1/status/leader", timeout=0.5) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def request(self, method: str, path: str, body: bytes | str | None = None,
                headers: dict[str, str] | None = None, timeout: float = 30.0) -> "RawResponse":
        """A raw HTTP call (no client library), for checking status codes, headers and
        bodies exactly as a Consul client would see them."""
        data = body.encode() if isinstance(body, str) else body
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return RawResponse(resp.status, dict(resp.headers), resp.read())
        except urllib.error.HTTPError as err:
            return RawResponse(err.code, dict(err.headers), err.read())

    def parked_queries(self) -> int:
        """Blocking queries the server holds right now (devconsul's debug endpoint)."""
        return int(self.request("GET", "/v1/devconsul/debug").json()["parked_queries"])

    def output(self) -> str:
        """The server's stdout+stderr so far (for failure messages)."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        return self._log_path.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        """SIGKILL: a crash, nothing flushed beyond what was fsync'd."""
        self._terminate(signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM and wait: a clean shutdown."""
        self._terminate(signal.SIGTERM)

    def _terminate(self, sig: signal.Signals) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        self.kill()
        if self._log_path is not None:
            self._log_path.unlink(missing_ok=True)

    def __enter__(self) -> "DevConsul":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


@dataclass(frozen=True)
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


def _tempfile() -> tuple[int, str]:
    import tempfile

    return tempfile.mkstemp(prefix="devconsul-", suffix=".log")
