"""The Consul ACL token rotates without a restart: the token file is replaced with a new
valid token, the old one is revoked in (dev)Consul, and the controller and the watcher
go on with the next request. A re-read that fails keeps the last good token and is
logged once, without the token."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

import pytest

from azprobe.clients.consul import ConsulSettings, make_client
from azprobe.consumers.watch import WeightWatcher
from azprobe.controller.config import parse_config
from azprobe.controller.main import Controller
from azprobe.dev.devconsul.testing import DevConsul
from azprobe.security import reloadable
from tests.controller_harness import drive_rounds, read_weights
from tests.fakeagent import FakeAgentServer, zone_agents
from tests.helpers import make_acl_token, revoke_acl_token, sample_weights_doc, wait_for

MASTER = "rotation-master-token"
AZS = ["az-a", "az-b", "az-c"]


def _write_token(path: Path, token: str) -> None:
    """As a rotation tool does: a new file beside it, renamed over the old one."""
    staged = path.with_suffix(".new")
    staged.write_text(token + "\n")
    staged.chmod(0o600)
    os.replace(staged, path)


@pytest.fixture
def acl_consul():
    with DevConsul(acl_master_token=MASTER) as dc:
        yield dc


def test_devconsul_makes_and_revokes_tokens(acl_consul):
    accessor, secret = make_acl_token(acl_consul, MASTER)
    client = make_client(ConsulSettings(address=acl_consul.url, token=secret))
    assert client.kv.put("k", "v") is True
    assert acl_consul.request("PUT", "/v1/acl/token", body="{}", headers={"X-Consul-Token": secret}).status == 403
    revoke_acl_token(acl_consul, MASTER, accessor)
    assert acl_consul.request("GET", "/v1/kv/k", headers={"X-Consul-Token": secret}).status == 403


def _publishes_past(ctl: Controller, server: FakeAgentServer, dc: DevConsul, index: int, loop) -> int:
    """Rounds until the leader's next heartbeat write lands above `index` (deadline 10 s)."""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        drive_rounds(ctl, server.agents.values(), rounds=1, loop=loop, simulated_clock=False)
        assert ctl.consul.consul_up is True and ctl.consul.election.is_leader
        if (now := _published_index(dc)) > index:
            return now
    raise AssertionError(f"no write above index {index} within 10 s")


def _published_index(dc: DevConsul) -> int:
    resp = dc.request("GET", "/v1/kv/azprobe/v1/weights", headers={"X-Consul-Token": MASTER})
    return resp.json()[0]["ModifyIndex"] if resp.status == 200 else 0


def test_the_controller_keeps_publishing_across_a_token_rotation(acl_consul, tmp_path, caplog):
    old_accessor, old = make_acl_token(acl_consul, MASTER)
    token_file = tmp_path / "consul.token"
    _write_token(token_file, old)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    with FakeAgentServer() as server:
        for key, agent in zone_agents(AZS, 1).items():
            server.add(key, agent)
        ctl = Controller(parse_config({
            "controller": {"name": "ctl", "listen": "127.0.0.1:9", "interval_s": 0.2, "evaluation_window_s": 2.0,
                           "lock_delay_s": 0},
            "consul": {"address": acl_consul.url, "token_file": str(token_file)},
            "agents": {"static": [server.url(k) for k in server.agents]},
            "safety": {"drain_dwell_s": 0, "heartbeat_s": 0.2}, "topology": {"azs": AZS}}))
        try:
            drive_rounds(ctl, server.agents.values(), rounds=3, loop=loop, simulated_clock=False)
            assert ctl.consul.consul_up is True and ctl.consul.election.is_leader
            first = _published_index(acl_consul)
            assert first > 0

            new_accessor, new = make_acl_token(acl_consul, MASTER)
            _write_token(token_file, new)
            revoke_acl_token(acl_consul, MASTER, old_accessor)
            second = _publishes_past(ctl, server, acl_consul, first, loop)

            # A broken rotation (a file that holds no token): the last good token stays, one warning.
            _write_token(token_file, "half written")
            with caplog.at_level(logging.WARNING):
                _publishes_past(ctl, server, acl_consul, second, loop)
                reloadable.reload_all()  # SIGHUP's re-read finds the same broken file: no second line
                drive_rounds(ctl, server.agents.values(), rounds=2, loop=loop, simulated_clock=False)
            assert ctl.consul.consul_up is True
            warned = [r.getMessage() for r in caplog.records if "keeping the last good secret" in r.getMessage()]
            assert len(warned) == 1 and "consul" in warned[0], warned
            assert new not in caplog.text and old not in caplog.text
        finally:
            ctl.consul.election.release()
            loop.run_until_complete(ctl.collector.close())
            loop.close()
            asyncio.set_event_loop(None)
    doc = read_weights(make_client(ConsulSettings(address=acl_consul.url, token=MASTER)))
    assert doc is not None and sorted(z.share for z in doc.zones.values()) == [33, 33, 34]


def test_the_watcher_reads_with_the_rotated_token(acl_consul, tmp_path):
    old_accessor, old = make_acl_token(acl_consul, MASTER)
    token_file = tmp_path / "watch.token"
    _write_token(token_file, old)
    admin = make_client(ConsulSettings(address=acl_consul.url, token=MASTER))
    admin.kv.put("azprobe/v1/weights", sample_weights_doc(1).dumps())
    settings = ConsulSettings.from_env(address=acl_consul.url, token_file=str(token_file))
    with WeightWatcher(settings, wait_s=1.0, backoff_cap_s=0.2) as watcher:
        assert watcher.wait_answered(10) and watcher.snapshot().generation == 1
        _, new = make_acl_token(acl_consul, MASTER)
        _write_token(token_file, new)
        revoke_acl_token(acl_consul, MASTER, old_accessor)
        admin.kv.put("azprobe/v1/weights", sample_weights_doc(2).dumps())
        wait_for(lambda: (watcher.snapshot() or sample_weights_doc(0)).generation == 2, timeout=10,
                 message="the watcher reads generation 2 with the new token")
        assert watcher.status().errors == 0, watcher.status().last_error
