"""DevConsul: run a real devconsul subprocess for tests, demos and benchmarks.

    with DevConsul(data_dir=tmp_path) as dc:
        consul.Consul(host=dc.host, port=dc.port)
        dc.kill(); dc.start()          # crash + restart on the same port and data dir

With `tls=DevConsulTls(...)` it serves HTTPS (and with verify_incoming, requires a client
certificate), and its own requests (the readiness check, `request()`) present the
client certificate given there.

It starts `python -m azprobe.dev.devconsul` (exactly what `azprobe devconsul` runs) on
127.0.0.1 port 0, reads the port the server bound from its --address-file (no free-port
race with other processes) and returns once /v1/status/leader answers, so a test never
races the server's startup. A restart (`start()` after `kill()`) asks for the same port
again, as a restarted Consul would listen where its clients expect it.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from azprobe.daemon.address_file import wait_for_address_file
from azprobe.security.tls import TlsFiles, client_context


@dataclass(frozen=True)
class DevConsulTls:
    """The server's certificate, key and CA (which must name 127.0.0.1), whether it
    verifies incoming clients, and the client certificate this helper's own requests send."""

    cert_file: str
    key_file: str
    ca_file: str
    verify_incoming: bool = False
    client_cert_file: str | None = None
    client_key_file: str | None = None

    def args(self) -> list[str]:
        args = ["--tls-cert-file", self.cert_file, "--tls-key-file", self.key_file, "--tls-ca-file", self.ca_file]
        return args + (["--verify-incoming"] if self.verify_incoming else [])

    def client(self) -> ssl.SSLContext:
        return client_context(TlsFiles(self.client_cert_file, self.client_key_file, self.ca_file), "devconsul test")


class DevConsul:
    def __init__(self, data_dir: str | Path | None = None, acl_master_token: str | None = None,
                 port: int | None = None, node_name: str = "devconsul-test",
                 start_timeout: float = 15.0, max_conns_per_client: int = 512,
                 tls: DevConsulTls | None = None) -> None:
        self.tls = tls
        self._client_ctx = tls.client() if tls is not None else None
        self.host = "127.0.0.1"
        self.port = port or 0  # 0 until the first start() learns the bound port
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.acl_master_token = acl_master_token  # passed in the environment, never on argv
        # above the 200 of Consul (and the CLI default): tests park 200 watchers and still ask /v1/devconsul/debug
        self.max_conns_per_client = max_conns_per_client
        self.node_name = node_name
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self._address_path: Path | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

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
        if self._address_path is not None:
            cmd += ["--address-file", str(self._address_path)]
        if self.data_dir is not None:
            cmd += ["--data-dir", str(self.data_dir)]
        cmd += ["--max-conns-per-client", str(self.max_conns_per_client)]
        return cmd + (self.tls.args() if self.tls else [])

    def start(self) -> "DevConsul":
        if self.proc is not None and self.proc.poll() is None:
            return self
        if self._log_path is None:
            log_fd, log_name = _tempfile()
            self._log_path = Path(log_name)
        else:  # a restart appends to the same log, so close() removes all of it
            log_fd = os.open(self._log_path, os.O_WRONLY | os.O_APPEND)
        self._address_path = self._log_path.with_suffix(".address")
        self._address_path.unlink(missing_ok=True)
        env = dict(os.environ)
        env.pop("CONSUL_HTTP_TOKEN", None)
        env.pop("DEVCONSUL_ACL_MASTER_TOKEN", None)
        if self.acl_master_token:
            env["DEVCONSUL_ACL_MASTER_TOKEN"] = self.acl_master_token
        self.proc = subprocess.Popen(self.command(), stdout=log_fd, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)
        os.close(log_fd)
        deadline = time.monotonic() + self.start_timeout
        proc = self.proc
        address = wait_for_address_file(self._address_path, alive=lambda: proc.poll() is None,
                                        timeout_s=self.start_timeout)
        if address is not None:
            self.port = address[1]
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
            with urllib.request.urlopen(f"{self.url}/v1/status/leader", timeout=0.5,
                                        context=self._client_ctx) as resp:
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
            with urllib.request.urlopen(req, timeout=timeout, context=self._client_ctx) as resp:
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
        for path in (self._log_path, self._address_path):
            if path is not None:
                path.unlink(missing_ok=True)

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
