"""Transactions (all-or-nothing, Consul's 200/409 shapes) and ACLs (default deny with a
master token) against a real devconsul."""

from __future__ import annotations

import base64
import json

import consul
import pytest

from azprobe.dev.devconsul.testing import DevConsul

TOKEN = "s3cr3t-master"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_txn_rollback_when_check_session_fails(devconsul):
    client = consul.Consul(host=devconsul.host, port=devconsul.port)
    leader = client.session.create(lock_delay=0)
    client.kv.put("azprobe/v1/leader", "ctl-1", acquire=leader)
    client.kv.put("azprobe/v1/weights", "old")
    deposed = client.session.create(lock_delay=0)
    ops = [{"KV": {"Verb": "check-session", "Key": "azprobe/v1/leader", "Session": deposed}},
           {"KV": {"Verb": "set", "Key": "azprobe/v1/weights", "Value": _b64("new")}},
           {"KV": {"Verb": "set", "Key": "azprobe/v1/weights/from/az-a", "Value": _b64("new")}}]
    index_before = client.kv.get("azprobe/v1/", recurse=True)[0]
    resp = devconsul.request("PUT", "/v1/txn", body=json.dumps(ops))
    assert resp.status == 409
    body = resp.json()
    assert body["Results"] is None and body["Errors"][0]["OpIndex"] == 0
    assert "session" in body["Errors"][0]["What"]
    assert client.kv.get("azprobe/v1/weights")[1]["Value"] == b"old"
    assert client.kv.get("azprobe/v1/weights/from/az-a")[1] is None
    assert client.kv.get("azprobe/v1/", recurse=True)[0] == index_before
    # the real leader's fenced write goes through, atomically
    ops[0]["KV"]["Session"] = leader
    ok = client.txn.put(ops)
    assert ok["Errors"] is None and [r["KV"]["Key"] for r in ok["Results"]] == [
        "azprobe/v1/leader", "azprobe/v1/weights", "azprobe/v1/weights/from/az-a"]
    assert all(r["KV"]["Value"] is None for r in ok["Results"])
    assert client.kv.get("azprobe/v1/weights/from/az-a")[1]["Value"] == b"new"


def test_txn_limits_and_bad_bodies(devconsul):
    too_many = [{"KV": {"Verb": "get", "Key": f"k{i}"}} for i in range(129)]
    resp = devconsul.request("PUT", "/v1/txn", body=json.dumps(too_many))
    assert resp.status == 413 and "too many operations" in resp.text
    assert devconsul.request("PUT", "/v1/txn", body="{oops").status == 400
    bad_b64 = [{"KV": {"Verb": "set", "Key": "k", "Value": "***"}}]
    assert devconsul.request("PUT", "/v1/txn", body=json.dumps(bad_b64)).status == 400
    unknown = devconsul.request("PUT", "/v1/txn", body=json.dumps([{"KV": {"Verb": "explode", "Key": "k"}}]))
    assert unknown.status == 409 and "unknown KV verb" in unknown.text
    reads = devconsul.request("PUT", "/v1/txn", body=json.dumps(
        [{"KV": {"Verb": "check-not-exists", "Key": "k"}}, {"KV": {"Verb": "get-tree", "Key": "k"}}]))
    assert reads.status == 200 and reads.json() == {"Results": [], "Errors": None}
    assert devconsul.request("GET", "/v1/txn").status == 405


@pytest.fixture
def acl_consul(tmp_path):
    with DevConsul(acl_master_token=TOKEN) as dc:
        yield dc


def test_acl_denies_without_token_and_allows_master(acl_consul):
    anon = consul.Consul(host=acl_consul.host, port=acl_consul.port)
    admin = consul.Consul(host=acl_consul.host, port=acl_consul.port, token=TOKEN)
    assert admin.kv.put("secret/k", "v") is True
    with pytest.raises(consul.ACLPermissionDenied, match="Permission denied"):
        anon.kv.get("secret/k")
    with pytest.raises(consul.ACLPermissionDenied):
        anon.kv.put("secret/k", "w")
    with pytest.raises(consul.ACLPermissionDenied):
        anon.session.create()
    with pytest.raises(consul.ACLPermissionDenied, match="ACL not found"):
        consul.Consul(host=acl_consul.host, port=acl_consul.port, token="wrong").kv.get("secret/k")
    # a recursive read is filtered, as Consul does: 404 plus the filtered header
    listing = acl_consul.request("GET", "/v1/kv/secret/?recurse")
    assert listing.status == 404 and listing.headers["X-Consul-Results-Filtered-By-ACLs"] == "true"
    # status stays open for health checks
    assert anon.status.leader() == "127.0.0.1:8300"
    assert admin.kv.get("secret/k")[1]["Value"] == b"v"


def test_acl_token_sources_and_txn(acl_consul):
    ops = json.dumps([{"KV": {"Verb": "set", "Key": "t/k", "Value": _b64("1")}}])
    denied = acl_consul.request("PUT", "/v1/txn", body=ops)  # py-consul's Txn.put sends no token
    assert denied.status == 409 and denied.json()["Errors"][0]["What"].startswith("Permission denied")
    for headers, path in (({"X-Consul-Token": TOKEN}, "/v1/txn"),
                          ({"Authorization": f"Bearer {TOKEN}"}, "/v1/txn"),
                          ({}, f"/v1/txn?token={TOKEN}")):
        assert acl_consul.request("PUT", path, body=ops, headers=headers).status == 200
    read = acl_consul.request("GET", "/v1/kv/t/k", headers={"Authorization": f"Bearer {TOKEN}"})
    assert read.status == 200 and read.headers["X-Consul-Default-Acl-Policy"] == "deny"
