"""Shared test helpers. Tests synchronise by polling a condition with a deadline, never
by sleeping a fixed time (a loaded 2-core box makes fixed sleeps flaky)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import pytest

from azprobe.controller.config import DEFAULT_EVALUATION_WINDOW_S

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent


def module_source(module: str) -> Path:
    """The source file of azprobe module `module` in this checkout (pyproject.toml's
    package-dir maps controller/ to azprobe.controller, ...), also when the module runs
    compiled and its __file__ is the extension."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    package = max((p for p in mapping if module == p or module.startswith(p + ".")), key=len)
    path = ROOT / mapping[package] / module[len(package):].lstrip(".").replace(".", "/")
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")

# The [safety] keys the lab tests' controllers run on (run_scenario's `safety`): a zone
# recovers after one evaluation window of health instead of the shipped 10 s and regains
# 10 points a cycle instead of 5, and panic ends after one window too. The lab tests check
# that a zone comes back and that panic ends; how long the shipped dwells hold and how
# slowly a zone regains are tests/unit/test_safety_rules.py's. Each run ends ~10 s sooner.
LAB_SAFETY = {"recover_dwell_s": DEFAULT_EVALUATION_WINDOW_S, "panic_exit_s": DEFAULT_EVALUATION_WINDOW_S,
              "max_increase_points": 10.0}


def stop_process(proc: "subprocess.Popen[bytes]", timeout_s: float = 10.0) -> None:
    """SIGTERM, and SIGKILL when it has not ended within `timeout_s`; reaped either way."""
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def write_secret(path: Path, text: str) -> Path:
    """A token file as operators must create it: mode 0600 (azprobe refuses looser ones)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def make_acl_token(dc: Any, master: str, description: str = "azprobe") -> tuple[str, str]:
    """A new ACL token from devconsul (`dc`: a DevConsul) made with the master token:
    (AccessorID, SecretID)."""
    resp = dc.request("PUT", "/v1/acl/token", body=json.dumps({"Description": description}),
                      headers={"X-Consul-Token": master})
    assert resp.status == 200, resp.text
    return resp.json()["AccessorID"], resp.json()["SecretID"]


def revoke_acl_token(dc: Any, master: str, accessor: str) -> None:
    assert dc.request("DELETE", f"/v1/acl/token/{accessor}", headers={"X-Consul-Token": master}).status == 200


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02,
             message: str = "condition") -> T:
    """Call `predicate` until it returns something truthy; return that value.

    Raises AssertionError naming `message` (and the last exception the predicate raised,
    if any) when `timeout` seconds pass first.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
            last_exc = None
        except Exception as exc:  # the condition may not be checkable yet
            last_exc = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc!r})" if last_exc else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {message}{detail}")
        time.sleep(interval)


def sample_weights_doc(generation: int = 1, shares: dict[str, int] | None = None, *,
                       ttl_s: float = 60.0, now: float | None = None, source_az: str | None = None,
                       term: str | None = None):
    """A valid weights document (azprobe.contracts.weights.WeightsDoc) for consumer tests."""
    from azprobe.contracts.weights import WeightsDoc, ZoneWeights

    shares = shares or {"az-a": 85, "az-b": 15}
    now = time.time() if now is None else now
    zones = {az: ZoneWeights(weight=1.0 if share >= 50 else 0.25, share=share, health=0.98 if share >= 50 else 0.3,
                             success=0.999, p95_ms=12.3, util=0.4, samples=1000,
                             state="ok" if share >= 50 else "degraded", reasons=(f"share {share}",))
             for az, share in shares.items()}
    return WeightsDoc(generation=generation, generated_at=now, expires_at=now + ttl_s, leader="ctl-test",
                      model="default", state="ok", zones=zones, source_az=source_az, term=term)


# --- prerequisites: skip on a developer's box, FAIL under CI -----------------------------
# CI runs `make test` as root with CI=true: there a missing prerequisite means the CI
# machine is broken, and a skip would pass the run without testing the kernel or the lab.

def in_ci(environ: dict[str, str] | None = None) -> bool:
    value = (os.environ if environ is None else environ).get("CI", "")
    return value.strip().lower() not in ("", "0", "false", "no", "off")


def require(ok: bool, missing: str, fix: str) -> None:
    """A test's prerequisite: skipped outside CI, a failure under CI, naming what is missing
    and how to fix it (e.g. require(os.geteuid() == 0, "needs root", "run make test as root"))."""
    if ok:
        return
    message = f"missing prerequisite: {missing}; {fix}"
    if in_ci():
        pytest.fail(f"{message} (CI=true: a missing prerequisite fails, it does not skip)", pytrace=False)
    pytest.skip(message)


def require_root(why: str) -> None:
    require(os.geteuid() == 0, f"needs root ({why})", "run make test as root")


def require_tools(*tools: str) -> None:
    absent = [t for t in tools if shutil.which(t) is None]
    require(not absent, f"{', '.join(absent)} not on PATH", "run `make setup` (scripts/setup-host.sh installs them)")


def marker_prerequisites(markers: Iterable[str]) -> None:
    """What the `kernel` and `lab` markers promise (pyproject.toml), checked before a test
    runs: the kernel tests need what the agent itself checks before loading BPF (root,
    BTF, tracefs, the tracepoints, bcc, kernel headers), the lab tests need root and the
    network tools."""
    names = set(markers)
    if "kernel" in names:
        from azprobe.agent.probe import check_prerequisites
        from azprobe.errors import PrerequisiteError

        try:
            check_prerequisites()
        except PrerequisiteError as exc:
            require(False, f"the kernel tests need BPF: {exc}", "run make test as root on a BTF kernel")
    if "lab" in names:
        require_root("the lab builds network namespaces")
        require_tools("ip", "nft")


# --- children on port 0 ----------------------------------------------------------------
# A child daemon listens on port 0 and writes the port it got to --address-file
# (azprobe.daemon.address_file); never "find a free port, close it, start the child on it".

def child_url(address_file, proc, timeout: float = 90.0) -> str:
    """http://host:port of a child started with --address-file, once it serves."""
    from azprobe.daemon.address_file import format_host_port, wait_for_address_file

    address = wait_for_address_file(address_file, alive=lambda: proc.poll() is None, timeout_s=timeout)
    assert address is not None, (f"{proc.args[:6]} wrote no address to {address_file} within {timeout}s "
                                 f"(exit code {proc.poll()})")
    return f"http://{format_host_port(*address)}"


@contextlib.contextmanager
def refused_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A port on which connects are refused for the whole block: bound but never listening,
    so no other process can take it meanwhile (a closed "free" port could be reused)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        yield sock.getsockname()[1]


class EchoServer:
    """A loopback TCP server that echoes whatever arrives, one connection at a time."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data)

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


@contextlib.contextmanager
def serve_http(handler: type) -> Iterator[str]:
    """A loopback ThreadingHTTPServer of `handler` on a thread, for the block: its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
