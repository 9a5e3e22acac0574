"""Sessions and locks through py-consul against devconsul: acquire/release, invalidation
releasing or deleting held keys, lock-delay, TTL expiry, renew of a dead session."""

from __future__ import annotations

import time

import consul
import pytest

from tests.helpers import wait_for


@pytest.fixture
def client(devconsul):
    return consul.Consul(host=devconsul.host, port=devconsul.port)


def test_acquire_release_between_two_sessions(client):
    s1 = client.session.create(name="ctl-1", lock_delay=0)
    s2 = client.session.create(name="ctl-2", lock_delay=0)
    assert client.kv.put("leader", "ctl-1", acquire=s1) is True
    assert client.kv.put("leader", "ctl-2", acquire=s2) is False
    entry = client.kv.get("leader")[1]
    assert entry["Session"] == s1 and entry["LockIndex"] == 1 and entry["Value"] == b"ctl-1"
    assert client.kv.put("leader", "", release=s2) is False
    assert client.kv.put("leader", "ctl-1", release=s1) is True
    assert "Session" not in client.kv.get("leader")[1]
    # a voluntary release starts no lock-delay
    assert client.kv.put("leader", "ctl-2", acquire=s2) is True
    assert client.kv.get("leader")[1]["LockIndex"] == 2


def test_destroy_releases_and_lock_delay_blocks_reacquire(client):
    s1 = client.session.create(lock_delay=1)
    assert client.kv.put("held", "v", acquire=s1)
    assert client.session.destroy(s1) is True
    entry = client.kv.get("held")[1]
    assert "Session" not in entry and entry["Value"] == b"v"
    s2 = client.session.create(lock_delay=0)
    started = time.monotonic()
    assert client.kv.put("held", "w", acquire=s2) is False  # within the 1 s lock-delay
    wait_for(lambda: client.kv.put("held", "w", acquire=s2), timeout=5, message="lock-delay to pass")
    assert time.monotonic() - started >= 0.5


def test_behavior_delete_removes_held_keys(client):
    sid = client.session.create(behavior="delete", lock_delay=0)
    client.kv.put("eph/a", "1", acquire=sid)
    client.kv.put("eph/b", "2")
    client.session.destroy(sid)
    assert client.kv.get("eph/a")[1] is None
    assert client.kv.get("eph/b")[1]["Value"] == b"2"


def test_session_info_list_renew_and_validation(client):
    sid = client.session.create(name="n", ttl=30, lock_delay=0)
    index, info = client.session.info(sid)
    assert info["ID"] == sid and info["TTL"] == "30s" and info["Behavior"] == "release"
    assert info["LockDelay"] == 0 and int(index) >= 1
    assert any(s["ID"] == sid for s in client.session.list()[1])
    assert any(s["ID"] == sid for s in client.session.node(info["Node"])[1])
    assert client.session.renew(sid)["ID"] == sid
    client.session.destroy(sid)
    assert client.session.info(sid)[1] is None
    with pytest.raises(consul.NotFound):
        client.session.renew(sid)
    with pytest.raises(consul.ConsulException, match="invalid session"):
        client.kv.put("k", "v", acquire="00000000-0000-0000-0000-000000000000")


def test_lock_delay_parsing_like_consul(devconsul):
    for body, expected_ns in (('{"LockDelay": "2s"}', 2_000_000_000), ('{"LockDelay": 3}', 3_000_000_000),
                              ('{"LockDelay": 1500000000}', 1_500_000_000), ("", 15_000_000_000)):
        sid = devconsul.request("PUT", "/v1/session/create", body=body).json()["ID"]
        assert devconsul.request("GET", f"/v1/session/info/{sid}").json()[0]["LockDelay"] == expected_ns
    short = devconsul.request("PUT", "/v1/session/create", body='{"TTL": "5s"}')
    assert short.status == 500 and short.text.startswith("Invalid Session TTL")  # py-consul checks this itself
    bad = devconsul.request("PUT", "/v1/session/create", body="{not json")
    assert bad.status == 400 and bad.text.startswith("Request decode failed")


@pytest.mark.slow
def test_ttl_expiry_releases_locked_key(client):
    """Consul invalidates a session after TTL x 2 without a renew; 10 s is the minimum TTL."""
    started = time.monotonic()  # before the create: the session cannot be older than this
    sid = client.session.create(ttl=10, lock_delay=0)
    keeper = client.session.create(ttl=10, lock_delay=0, behavior="delete")
    assert client.kv.put("ttl/lock", "x", acquire=sid)
    assert client.kv.put("ttl/eph", "y", acquire=keeper)
    # neither is renewed: both expire, one releasing its key, one deleting it
    wait_for(lambda: client.session.info(sid)[1] is None, timeout=60, interval=0.2, message="session expiry")
    # Not before 2 x TTL (a lower bound: a slow machine only makes it later); how soon after
    # is the wait's deadline, not an assertion.
    assert time.monotonic() - started >= 2 * 10
    assert "Session" not in client.kv.get("ttl/lock")[1]
    wait_for(lambda: client.kv.get("ttl/eph")[1] is None, timeout=5, message="delete-behavior expiry")
    with pytest.raises(consul.NotFound):
        client.session.renew(sid)
