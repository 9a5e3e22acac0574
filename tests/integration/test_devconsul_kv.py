"""py-consul (the production client) and raw HTTP against a real devconsul process: the
KV endpoint's semantics, headers and error answers as Consul gives them."""

from __future__ import annotations

import threading

import consul
import pytest


@pytest.fixture
def client(devconsul):
    return consul.Consul(host=devconsul.host, port=devconsul.port)


def test_put_get_delete_with_flags_and_binary(client):
    blob = bytes(range(256))
    assert client.kv.put("app/bin", blob, flags=42) is True
    index, entry = client.kv.get("app/bin")
    assert entry["Value"] == blob and entry["Flags"] == 42
    assert int(index) == entry["ModifyIndex"] == entry["CreateIndex"] >= 1
    assert "Session" not in entry
    assert client.kv.delete("app/bin") is True
    index_after, gone = client.kv.get("app/bin")
    assert gone is None and int(index_after) > int(index)


def test_empty_value_is_null(client):
    client.kv.put("empty", None)
    assert client.kv.get("empty")[1]["Value"] is None


def test_recurse_and_keys_with_separator(client):
    for key in ("cfg/a", "cfg/b/c", "cfg/b/d", "cfg2/x"):
        client.kv.put(key, key)
    index, entries = client.kv.get("cfg/", recurse=True)
    assert [e["Key"] for e in entries] == ["cfg/a", "cfg/b/c", "cfg/b/d"]
    assert int(index) == max(e["ModifyIndex"] for e in entries)
    assert client.kv.get("cfg/", keys=True, separator="/")[1] == ["cfg/a", "cfg/b/"]
    assert client.kv.get("cfg", keys=True)[1] == ["cfg/a", "cfg/b/c", "cfg/b/d", "cfg2/x"]
    client.kv.delete("cfg/b/", recurse=True)
    assert client.kv.get("cfg/", keys=True)[1] == ["cfg/a"]
    assert client.kv.get("nothing/", recurse=True)[1] is None


def test_raw_and_missing_key_headers(devconsul, client):
    client.kv.put("raw/k", b"\x00plain")
    resp = devconsul.request("GET", "/v1/kv/raw/k?raw")
    assert resp.status == 200 and resp.body == b"\x00plain"
    missing = devconsul.request("GET", "/v1/kv/raw/nope")
    assert missing.status == 404 and missing.body == b""
    assert int(missing.headers["X-Consul-Index"]) >= 1
    assert missing.headers["X-Consul-KnownLeader"] == "true"
    assert missing.headers["X-Consul-LastContact"] == "0"


def test_cas_two_racing_writers_exactly_one_wins(client):
    client.kv.put("race", "start")
    index = client.kv.get("race")[1]["ModifyIndex"]
    barrier = threading.Barrier(2)
    outcomes: dict[str, bool] = {}

    def writer(name: str) -> None:
        own = consul.Consul(host=client.http.host, port=client.http.port)
        barrier.wait()
        outcomes[name] = own.kv.put("race", name, cas=index)

    threads = [threading.Thread(target=writer, args=(n,)) for n in ("w1", "w2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert sorted(outcomes.values()) == [False, True]
    winner = next(n for n, ok in outcomes.items() if ok)
    assert client.kv.get("race")[1]["Value"] == winner.encode()
    # cas=0 means "only if absent"
    assert client.kv.put("race", "again", cas=0) is False
    assert client.kv.put("fresh-key", "x", cas=0) is True


def test_delete_cas(client):
    client.kv.put("dc", "1")
    idx = client.kv.get("dc")[1]["ModifyIndex"]
    assert client.kv.delete("dc", cas=idx + 100) is False
    assert client.kv.delete("dc", cas=idx) is True
    assert client.kv.get("dc")[1] is None


def test_value_limit_bad_input_and_method(devconsul):
    big = devconsul.request("PUT", "/v1/kv/big", body=b"x" * (512 * 1024 + 1))
    assert big.status == 413 and "too large" in big.text
    assert devconsul.request("PUT", "/v1/kv/ok", body=b"x" * (512 * 1024)).text == "true"
    assert devconsul.request("PUT", "/v1/kv/k?cas=1&acquire=x").status == 400
    assert devconsul.request("PUT", "/v1/kv/k?flags=abc").status == 500
    bad = devconsul.request("POST", "/v1/kv/k", body=b"")
    assert bad.status == 405 and "not allowed" in bad.text
    assert devconsul.request("GET", "/v1/kv/k?index=abc").status == 400
    assert devconsul.request("GET", "/v1/kv/k?index=1&wait=forever").text == "Invalid wait time"
    assert devconsul.request("GET", "/v1/kv/k?dc=elsewhere").status == 500
    assert devconsul.request("GET", "/v1/nope").status == 404
