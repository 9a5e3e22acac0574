"""An agent reloaded (SIGHUP: request_reload, taken by its loop) after its name, AZ and
token file changed: the next request, also on a connection opened before, needs the new
token, and every window of the boot still carries the running name and AZ (the
controller refuses a boot with two identities)."""

from __future__ import annotations

import http.client
import json
import logging
from pathlib import Path

from azprobe.agent.sockdiag import SockDiagCollector
from tests.agent_harness import latest_seq, running_agent
from tests.helpers import wait_for, write_secret

OLD, NEW = "tok-old-1234567890", "tok-new-0987654321"


def write_config(tmp_path: Path, name: str, az: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(f'[node]\nname = "{name}"\naz = "{az}"\n'
                    f'[agent]\ninterval_s = 0.1\ntoken_file = "{tmp_path / "tok"}"\n'
                    '[topology]\naz-a = ["127.0.0.0/8"]\naz-b = ["10.0.0.0/8"]\n')
    return path


def get(conn: http.client.HTTPConnection, token: str) -> tuple[int, dict]:
    conn.request("GET", "/v1/windows?after=0", headers={"Authorization": f"Bearer {token}",
                                                        "Accept": "application/json"})
    response = conn.getresponse()
    body = response.read()
    return response.status, json.loads(body) if response.status == 200 else {}


def test_reload_rotates_the_token_and_keeps_the_identity(tmp_path, caplog):
    write_secret(tmp_path / "tok", OLD + "\n")
    config = write_config(tmp_path, "node-a1", "az-a")
    collector = SockDiagCollector()
    try:
        with running_agent(config, probe=collector) as agent:
            host, port = agent.bound_address
            before = http.client.HTTPConnection(host, port, timeout=5)
            fresh = None
            try:
                wait_for(lambda: latest_seq(agent) >= 1, timeout=10, message="first window")
                assert get(before, OLD)[0] == 200
                write_config(tmp_path, "node-a9", "az-b")
                write_secret(tmp_path / "tok", NEW + "\n")
                with caplog.at_level(logging.INFO, logger="azprobe.agent"):
                    agent.request_reload()
                    wait_for(lambda: agent.config.token == NEW, timeout=10, message="the reload taken")
                seq = latest_seq(agent)
                # the connection that proved the old token: its next request is checked against the new one
                assert get(before, OLD)[0] == 401
                assert get(before, NEW)[0] == 200
                fresh = http.client.HTTPConnection(host, port, timeout=5)
                assert get(fresh, OLD)[0] == 401
                wait_for(lambda: latest_seq(agent) > seq + 1, timeout=10, message="windows after the reload")
                status, page = get(fresh, NEW)
            finally:
                before.close()
                if fresh is not None:
                    fresh.close()
    finally:
        collector.close()
    assert status == 200
    assert (page["node"], page["az"]) == ("node-a1", "az-a")
    assert {(w["node"], w["az"], w["boot_id"]) for w in page["windows"]} == {("node-a1", "az-a", page["boot_id"])}
    assert any(w["seq"] > seq for w in page["windows"])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["reload: node.name changed from 'node-a1' to 'node-a9', node.az changed from 'az-a' to "
                        "'az-b': need a restart, running on with the old values"]
    assert not any(OLD in r.getMessage() or NEW in r.getMessage() for r in caplog.records)
