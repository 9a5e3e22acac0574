"""WeightWatcher against a real devconsul: follows KV writes, keeps last-known-good
through crashes, bad documents and deleted keys, and reports staleness."""

from __future__ import annotations

import json

import pytest

from azprobe.clients.consul import ConsulSettings, make_client
from azprobe.dev.devconsul.testing import DevConsul
from azprobe.consumers.watch import EMPTY, FRESH, STALE, WeightWatcher
from azprobe.contracts.weights import REJECTED
from tests.helpers import sample_weights_doc, wait_for

KEY = "azprobe/v1/weights"


def put(dc: DevConsul, value: str | bytes, key: str = KEY, token: str | None = None) -> None:
    client = make_client(ConsulSettings(address=dc.url, token=token))
    assert client.kv.put(key, value) is True


def generation_of(watcher: WeightWatcher) -> int | None:
    doc = watcher.snapshot()
    return None if doc is None else doc.generation


@pytest.fixture
def watcher(devconsul):
    seen = []
    w = WeightWatcher(ConsulSettings(address=devconsul.url), on_change=seen.append,
                      wait_s=5.0, backoff_base_s=0.05, backoff_cap_s=0.5)
    w.seen = seen  # type: ignore[attr-defined]
    with w:
        assert w.wait_answered(timeout=10)
        yield w


def test_snapshot_follows_kv_writes(devconsul, watcher):
    status = watcher.status()
    assert status.state == EMPTY and status.key_absent and watcher.snapshot() is None
    put(devconsul, sample_weights_doc(1).dumps())
    wait_for(lambda: generation_of(watcher) == 1, timeout=5, message="generation 1 in the snapshot")
    put(devconsul, sample_weights_doc(2, {"az-a": 40, "az-b": 60}).dumps())
    wait_for(lambda: generation_of(watcher) == 2, timeout=5, message="generation 2 in the snapshot")
    assert watcher.snapshot().zones["az-b"].share == 60
    assert [d.generation for d in watcher.seen] == [1, 2]
    assert watcher.status().state == FRESH


BAD_DOCS = {
    "truncated JSON": lambda good: good[: len(good) // 2],
    "wrong type": lambda good: good.replace('"share":85', '"share":"85"'),
    "NaN": lambda good: good.replace('"health":0.98', '"health":NaN'),
    "huge value": lambda good: good.replace('"samples":1000', '"samples":' + "9" * 40, 1),
    "unknown schema": lambda good: good.replace('"schema":1', '"schema":7'),
    "binary": lambda good: b"\x00\xff\xfe" * 10,
}


def test_bad_documents_are_counted_and_keep_last_known_good(devconsul, watcher):
    good = sample_weights_doc(5).dumps()
    put(devconsul, good)
    wait_for(lambda: generation_of(watcher) == 5, timeout=5, message="the good document")
    for name, corrupt in BAD_DOCS.items():
        rejected_before, global_before = watcher.rejected, REJECTED.value
        put(devconsul, corrupt(good))
        wait_for(lambda: watcher.rejected == rejected_before + 1, timeout=5, message=f"{name} rejected")
        assert REJECTED.value >= global_before + 1
        assert generation_of(watcher) == 5, name
        assert "rejected document" in watcher.status().last_error
    assert watcher._thread.is_alive()  # nothing crashed
    put(devconsul, sample_weights_doc(6).dumps())
    wait_for(lambda: generation_of(watcher) == 6, timeout=5, message="recovery after bad documents")
    assert watcher.status().last_error is None


def test_older_generation_is_ignored(devconsul, watcher):
    newer = sample_weights_doc(9)
    put(devconsul, newer.dumps())
    wait_for(lambda: generation_of(watcher) == 9, timeout=5, message="generation 9")
    older = sample_weights_doc(3, now=newer.generated_at - 10)
    put(devconsul, older.dumps())
    wait_for(lambda: watcher.status().ignored_older == 1, timeout=5, message="the replay ignored")
    assert generation_of(watcher) == 9


def test_deleted_key_keeps_last_known_good(devconsul, watcher):
    put(devconsul, sample_weights_doc(4).dumps())
    wait_for(lambda: generation_of(watcher) == 4, timeout=5, message="generation 4")
    make_client(ConsulSettings(address=devconsul.url)).kv.delete(KEY)
    wait_for(lambda: watcher.status().key_absent, timeout=5, message="the deletion seen")
    assert generation_of(watcher) == 4


def test_keeps_last_known_good_while_devconsul_is_down_then_recovers(devconsul, watcher):
    doc = sample_weights_doc(1)
    put(devconsul, doc.dumps())
    wait_for(lambda: generation_of(watcher) == 1, timeout=5, message="generation 1")
    devconsul.kill()
    wait_for(lambda: watcher.errors >= 2, timeout=10, message="watch errors while devconsul is down")
    status = watcher.status()
    assert status.state == FRESH and generation_of(watcher) == 1
    assert "cannot reach Consul" in status.last_error
    # Past expires_at the held document is reported stale, never served as fresh.
    assert watcher.snapshot(now=doc.expires_at + 1) is None
    assert watcher.status(now=doc.expires_at + 1).state == STALE
    assert watcher.last_known_good() is not None
    devconsul.start()
    put(devconsul, sample_weights_doc(2).dumps())
    wait_for(lambda: generation_of(watcher) == 2, timeout=10, message="generation 2 after restart")


def test_permission_denied_is_an_error_not_no_data(tmp_path):
    with DevConsul(acl_master_token="root-token") as dc:
        put(dc, sample_weights_doc(3).dumps(), token="root-token")
        denied = WeightWatcher(ConsulSettings(address=dc.url), wait_s=5.0, backoff_base_s=0.05,
                               backoff_cap_s=0.2)
        allowed = WeightWatcher(ConsulSettings(address=dc.url, token="root-token"), wait_s=5.0)
        with denied, allowed:
            wait_for(lambda: denied.errors >= 1, timeout=5, message="a 403 counted as an error")
            status = denied.status()
            assert status.state == EMPTY and not status.key_absent
            assert "permission denied" in status.last_error
            wait_for(lambda: generation_of(allowed) == 3, timeout=5, message="the token reads the key")


def test_source_az_key(devconsul):
    doc = sample_weights_doc(2, source_az="az-a")
    put(devconsul, doc.dumps(), key="azprobe/v1/weights/from/az-a")
    with WeightWatcher(ConsulSettings(address=devconsul.url), key="weights/from/az-a", wait_s=5.0) as w:
        wait_for(lambda: w.snapshot() is not None, timeout=5, message="the per-AZ view")
        assert w.snapshot().source_az == "az-a"
        assert json.loads(w.snapshot().dumps())["source_az"] == "az-a"
