"""`azprobe xds serve` with `[xds.tls]` and a client CA (mutual TLS), over real grpcio
handshakes with certificates from tests/pki.py: a client with a certificate of the
client CA gets its assignment, one without a certificate or with another CA's does not,
and a rotated client CA takes effect on the next connection without a restart."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import grpc
import pytest

from tests import xds_harness as h
from tests.pki import Leaf, TestCA

pytestmark = pytest.mark.slow
SERVER_NAME = "xds.lab.test"


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


def _credentials(ca: TestCA, leaf: Leaf | None) -> grpc.ChannelCredentials:
    if leaf is None:
        return grpc.ssl_channel_credentials(root_certificates=_read(ca.cert_file))
    return grpc.ssl_channel_credentials(root_certificates=_read(ca.cert_file), private_key=_read(leaf.key_file),
                                        certificate_chain=_read(leaf.cert_file))


async def _assignment(address: str, creds: grpc.ChannelCredentials) -> tuple[str, object]:
    """("ok", the assignment) or (status code name, details) of one delta ADS stream."""
    options = [("grpc.ssl_target_name_override", SERVER_NAME), ("grpc.use_local_subchannel_pool", 1)]
    async with grpc.aio.secure_channel(address, creds, options=options) as ch:
        s = h.Stream(h.ads_stub(ch).DeltaAggregatedResources(timeout=10))
        try:
            await s.send(h.delta(h.CLA, ["backend"], zone="az-a"))
        except grpc.aio.AioRpcError as exc:  # the handshake failed before the request went out
            s.cancel()
            return exc.code().name, exc.details()
        r = await s.recv(10)
        status = await s.ended(0) if r is None else None
        s.cancel()
    if r is None:
        return (status.name if status is not None else "no answer"), s.details
    cla = h.assignment(r.resources[0].resource)
    h.assert_never_empty(cla)
    return "ok", cla


@pytest.fixture
def pki(tmp_path):
    ca = TestCA.create(tmp_path / "pki", "xds-ca")
    other = TestCA.create(tmp_path / "pki", "other-ca")
    server = ca.issue("xds", dns=[SERVER_NAME])
    return ca, other, server


def _start(devconsul, tmp_path: Path, server: Leaf, client_ca: str) -> h.XdsProcess:
    cfg = h.write_config(tmp_path / "xds", devconsul.url,
                         xds={"tls": {"cert_file": server.cert_file, "key_file": server.key_file, "ca_file": client_ca}})
    return h.XdsProcess(cfg, tmp_path / "xds").start()


def test_mtls_serves_a_client_of_the_ca_and_refuses_one_without_a_certificate_or_of_another_ca(
        devconsul, tmp_path, pki):
    ca, other, server = pki
    xds = _start(devconsul, tmp_path, server, ca.cert_file)
    try:
        member, stranger = ca.issue("envoy-1"), other.issue("envoy-2")

        async def run():
            return {"member": await _assignment(xds.address, _credentials(ca, member)),
                    "no certificate": await _assignment(xds.address, _credentials(ca, None)),
                    "other CA": await _assignment(xds.address, _credentials(ca, stranger)),
                    "plaintext": await _plaintext(xds.address)}

        got = asyncio.run(run())
        assert got["member"][0] == "ok", got
        assert [l[0] for l in h.localities(got["member"][1])] == ["az-a", "az-b", "az-c"]
        for refused in ("no certificate", "other CA", "plaintext"):
            assert got[refused][0] == "UNAVAILABLE", (refused, got[refused])
        assert xds.proc.poll() is None  # refused handshakes end only their own connection
        assert asyncio.run(_assignment(xds.address, _credentials(ca, member)))[0] == "ok"
    finally:
        xds.stop()


async def _plaintext(address: str) -> tuple[str, object]:
    async with grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
        s = h.Stream(h.ads_stub(ch).DeltaAggregatedResources(timeout=10))
        try:
            await s.send(h.delta(h.CLA, ["backend"]))
        except grpc.aio.AioRpcError as exc:
            s.cancel()
            return exc.code().name, exc.details()
        r = await s.recv(10)
        status = await s.ended(0)
        s.cancel()
    return ("ok", r) if r is not None else ((status.name if status else "no answer"), s.details)


def test_a_rotated_client_ca_takes_effect_on_the_next_connection_without_a_restart(devconsul, tmp_path, pki):
    ca, other, server = pki
    client_ca = tmp_path / "client-ca.crt"
    shutil.copyfile(ca.cert_file, client_ca)
    xds = _start(devconsul, tmp_path, server, str(client_ca))
    try:
        old_member, new_member = ca.issue("envoy-old"), other.issue("envoy-new")
        assert asyncio.run(_assignment(xds.address, _credentials(ca, old_member)))[0] == "ok"
        assert asyncio.run(_assignment(xds.address, _credentials(ca, new_member)))[0] == "UNAVAILABLE"
        # the rotation: the file is replaced whole, as a deployment tool does
        (tmp_path / "client-ca.new").write_bytes(_read(other.cert_file))
        (tmp_path / "client-ca.new").rename(client_ca)
        deadline = time.monotonic() + 15
        while asyncio.run(_assignment(xds.address, _credentials(ca, new_member)))[0] != "ok":
            assert time.monotonic() < deadline, "the new client CA was not taken up"
        assert asyncio.run(_assignment(xds.address, _credentials(ca, old_member)))[0] == "UNAVAILABLE"
        # a rotation that does not load keeps the material in use
        (tmp_path / "client-ca.bad").write_bytes(b"-----BEGIN CERTIFICATE-----\ntruncated\n")
        (tmp_path / "client-ca.bad").rename(client_ca)
        deadline = time.monotonic() + 10
        while "do not load" not in xds.log.read_text():
            assert time.monotonic() < deadline, "the failed rotation was not logged"
            asyncio.run(_assignment(xds.address, _credentials(ca, new_member)))
        assert asyncio.run(_assignment(xds.address, _credentials(ca, new_member)))[0] == "ok"
    finally:
        xds.stop()
