"""The xDS server's certificate rotation against files replaced while they are read, with
real files, real OpenSSL checks and the real fetcher grpc calls (its two grpc
constructors are wrapped only to see what each configuration holds):

- the material loaded is always a pair the checks saw together, never the certificate of
  one rotation with the key of another (the files are renamed one after the other);
- a rotation that lands while a fetch is between taking the material and recording it
  reaches grpc at the next fetch, instead of never."""

from __future__ import annotations

import itertools
import os
import sys
import threading
from pathlib import Path

import grpc
import pytest

from azprobe.consumers.xds import credentials
from azprobe.errors import ConfigError
from azprobe.security import reloadable, tls
from azprobe.security.tls import Rotating, TlsFiles, server_pem
from tests.helpers import wait_for
from tests.pki import TestCA

LOADS = 300  # good loads each test waits for; ~1 in 10 was a mismatched pair before the fix


@pytest.fixture
def rotation(tmp_path: Path):
    """(the files, [(key, chain) of pair A, of pair B]), the files holding pair A."""
    ca = TestCA.create(tmp_path / "ca", "xds-ca")
    pairs = []
    for name in ("a", "b"):
        leaf = ca.issue(f"xds-{name}", dns=[f"{name}.xds.lab"])
        pairs.append((Path(leaf.key_file).read_bytes(), Path(leaf.cert_file).read_bytes()))
    live = tmp_path / "live"
    live.mkdir()
    files = TlsFiles(cert_file=str(live / "tls.crt"), key_file=str(live / "tls.key"))
    install(files, *pairs[0])
    return files, pairs


def _replace(path: str, data: bytes) -> None:
    tmp = f"{path}.new"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def install(files: TlsFiles, key: bytes, chain: bytes) -> None:
    """A rotation as cert-manager-like tools do it: each file renamed into place, the
    certificate first, then the key."""
    assert files.cert_file and files.key_file
    _replace(files.cert_file, chain)
    _replace(files.key_file, key)


class Rotator:
    """Installs pair A, B, A, ... on its own thread until stopped."""

    def __init__(self, files: TlsFiles, pairs: list[tuple[bytes, bytes]]) -> None:
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(files, pairs), daemon=True)
        self.thread.start()

    def _run(self, files: TlsFiles, pairs: list[tuple[bytes, bytes]]) -> None:
        for key, chain in itertools.cycle(pairs):
            if self.stopping.is_set():
                return
            install(files, key, chain)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)
        assert not self.thread.is_alive()


def test_server_pem_returns_only_a_pair_its_checks_saw_together(rotation):
    files, pairs = rotation
    rotator = Rotator(files, pairs)
    loaded: list[tuple[bytes, bytes]] = []
    refused = [0]

    def load() -> bool:
        try:
            pem = server_pem(files, "xds.tls")
        except ConfigError:  # the files caught between the two renames: refused, fine
            refused[0] += 1
            return False
        loaded.append((pem.key, pem.chain))
        return len(loaded) >= LOADS

    try:
        wait_for(load, timeout=60, interval=0, message=f"{LOADS} loads while the files rotate")
    finally:
        rotator.stop()
    mismatched = sum(1 for pair in loaded if pair not in pairs)
    assert mismatched == 0, f"{mismatched} of {len(loaded)} loads were not a pair ({refused[0]} refused)"


def test_the_fetchers_and_a_sighup_reload_racing_a_rotation_always_hold_a_matching_pair(rotation):
    files, pairs = rotation
    material = Rotating(files, "xds.tls", server_pem)
    fetcher = credentials._CertificateFetcher(material)
    handed: list[tuple[bytes, bytes]] = []
    stopping = threading.Event()

    def fetching() -> None:  # grpc's threads, one per handshake
        while not stopping.is_set():
            pem = fetcher.newer()
            if pem is not None:
                handed.append((pem.key, pem.chain))

    fetchers = [threading.Thread(target=fetching, daemon=True) for _ in range(2)]
    for thread in fetchers:
        thread.start()
    rotator = Rotator(files, pairs)
    try:
        # SIGHUP's reloads, as fast as they go: many more builds than the once-a-second check makes.
        wait_for(lambda: material.reload() and material.generation > LOADS // 3, timeout=60, interval=0,
                 message="rebuilds while the files rotate")
        wait_for(lambda: len(handed) > 1, timeout=10, message="the fetchers to hand grpc new material")
    finally:
        rotator.stop()
        stopping.set()
        for thread in fetchers:
            thread.join(10)
    assert not any(thread.is_alive() for thread in fetchers)
    held = material.current()
    assert (held.key, held.chain) in pairs
    mismatched = sum(1 for pair in handed if pair not in pairs)
    assert mismatched == 0, f"{mismatched} of {len(handed)} configurations handed to grpc were not a pair"


def test_a_rotation_during_a_fetch_reaches_grpc_at_the_next_fetch(rotation, monkeypatch):
    files, pairs = rotation
    made: list[bytes] = []  # the chain of each configuration built for grpc, in order
    fetchers: list = []
    build = grpc.ssl_server_certificate_configuration
    dynamic = grpc.dynamic_ssl_server_credentials

    def configuration(key_chains, root_certificates=None):
        made.append(key_chains[0][1])
        return build(key_chains, root_certificates=root_certificates)

    def dynamic_credentials(initial, fetcher, require_client_authentication=False):
        fetchers.append(fetcher)
        return dynamic(initial, fetcher, require_client_authentication=require_client_authentication)

    monkeypatch.setattr(grpc, "ssl_server_certificate_configuration", configuration)
    monkeypatch.setattr(grpc, "dynamic_ssl_server_credentials", dynamic_credentials)
    credentials.server_credentials(files)
    (fetch,) = fetchers
    assert made == [pairs[0][1]]

    # Pause the fetching thread just after it has taken the material (the return of its
    # first call into azprobe/security/tls.py), rotate and reload meanwhile, then resume.
    took, resume = threading.Event(), threading.Event()

    def tracer(frame, event, _arg):
        if (event == "call" and not took.is_set() and frame.f_code.co_filename == tls.__file__
                and frame.f_back is not None and frame.f_back.f_code.co_filename == credentials.__file__):
            def on_return(_frame, inner_event, _inner_arg):
                if inner_event == "return" and not took.is_set():
                    took.set()
                    resume.wait(30)
                return on_return
            return on_return
        return None

    answers: list[object] = []

    def fetching() -> None:
        sys.settrace(tracer)
        try:
            answers.append(fetch())
        finally:
            sys.settrace(None)

    thread = threading.Thread(target=fetching, daemon=True)
    thread.start()
    try:
        assert took.wait(30), "the fetch never took the material"
        install(files, *pairs[1])
        reloadable.reload_all()  # SIGHUP, on its own thread as in the daemons
    finally:
        resume.set()
        thread.join(30)
    assert not thread.is_alive() and len(answers) == 1
    for _ in range(3):  # the next handshakes' fetches
        fetch()
    assert made[-1] == pairs[1][1], "grpc was left on the certificate from before the rotation"
