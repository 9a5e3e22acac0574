"""The devconsul state machine, without HTTP: Consul's index rules, CAS, locks,
lock-delay, all-or-nothing transactions, session invalidation, and WAL replay."""

from __future__ import annotations

import pytest

from azprobe.dev.devconsul.persist import WriteAheadLog
from azprobe.dev.devconsul.store import SERF_CHECK_ID, Store, StoreError


def _store_with_node() -> Store:
    store = Store()
    store.catalog_register({"Node": "n1", "Address": "127.0.0.1"}, None,
                           [{"CheckID": SERF_CHECK_ID, "Status": "passing"}])
    return store


def test_set_assigns_increasing_indexes_and_keeps_create_index():
    store = Store()
    ok, c1 = store.kv_apply("set", "a", b"1")
    ok2, c2 = store.kv_apply("set", "a", b"2", flags=7)
    assert ok and ok2 and c2.index == c1.index + 1
    idx, entry = store.kv_get("a")
    assert idx == entry["ModifyIndex"] == c2.index
    assert entry["CreateIndex"] == c1.index and entry["Flags"] == 7 and entry["Value"] == b"2"


def test_missing_key_reports_table_index_and_prefix_index_survives_delete():
    store = Store()
    store.kv_apply("set", "p/a", b"")
    _, c = store.kv_apply("set", "other", b"")
    assert store.kv_get("nope")[0] == c.index  # the whole KV table's index
    _, d = store.kv_apply("delete", "p/a")
    idx, entries = store.kv_list("p/")
    # the tombstone keeps the prefix index at the delete, so a watcher sees the delete
    assert entries == [] and idx == d.index


def test_deleting_a_missing_key_consumes_no_index():
    store = Store()
    store.kv_apply("set", "a", b"")
    before = store.index
    ok, commit = store.kv_apply("delete", "zzz")
    assert ok and commit is None and store.index == before


def test_keys_with_separator_fold_subtrees():
    store = Store()
    for k in ("a/b", "a/c/d", "a/c/e", "a/f/", "b"):
        store.kv_apply("set", k, b"")
    assert store.kv_keys("a/", "/")[1] == ["a/b", "a/c/", "a/f/"]
    assert store.kv_keys("", "")[1] == ["a/b", "a/c/d", "a/c/e", "a/f/", "b"]


def test_cas_zero_creates_only_and_cas_index_must_match():
    store = Store()
    assert store.kv_apply("cas", "k", b"1", cas=0)[0] is True
    assert store.kv_apply("cas", "k", b"2", cas=0)[0] is False
    _, entry = store.kv_get("k")
    assert store.kv_apply("cas", "k", b"3", cas=entry["ModifyIndex"] + 5)[0] is False
    assert store.kv_apply("cas", "k", b"3", cas=entry["ModifyIndex"])[0] is True
    assert store.kv_get("k")[1]["Value"] == b"3"
    assert store.kv_apply("delete-cas", "k", cas=1)[0] is False
    assert store.kv_apply("delete-cas", "k", cas=store.kv_get("k")[0])[0] is True


def test_lock_semantics_lock_index_and_holder():
    store = _store_with_node()
    s1, _ = store.session_create("n1")
    s2, _ = store.session_create("n1")
    assert store.kv_apply("lock", "l", b"a", session=s1)[0]
    assert store.kv_apply("lock", "l", b"b", session=s1)[0]  # the holder may re-acquire
    assert store.kv_get("l")[1]["LockIndex"] == 1
    assert not store.kv_apply("lock", "l", b"c", session=s2)[0]
    assert not store.kv_apply("unlock", "l", b"", session=s2)[0]
    # a plain set keeps the holder (kvsSetTxn without updateSession)
    store.kv_apply("set", "l", b"d")
    assert store.kv_get("l")[1]["Session"] == s1
    assert store.kv_apply("unlock", "l", b"e", session=s1)[0]
    assert store.kv_apply("lock", "l", b"f", session=s2)[0]
    assert store.kv_get("l")[1]["LockIndex"] == 2
    with pytest.raises(StoreError, match="invalid session"):
        store.kv_apply("lock", "x", b"", session="not-a-session")


def test_session_needs_registered_node_and_checks():
    store = _store_with_node()
    with pytest.raises(StoreError, match="Missing node registration"):
        store.session_create("ghost")
    with pytest.raises(StoreError, match="Missing check"):
        store.session_create("n1", checks=["no-such-check"])
    with pytest.raises(StoreError, match="Behavior"):
        store.session_create("n1", behavior="explode")


@pytest.mark.parametrize("behavior", ["release", "delete"])
def test_invalidation_releases_or_deletes_and_arms_lock_delay(behavior):
    store = _store_with_node()
    sid, _ = store.session_create("n1", behavior=behavior, lock_delay_ns=5_000_000_000)
    store.kv_apply("lock", "l", b"v", session=sid)
    store.session_destroy(sid, now=100.0)
    entry = store.kv_get("l")[1]
    if behavior == "release":
        assert entry["Session"] == "" and entry["Value"] == b"v"
    else:
        assert entry is None
    other, _ = store.session_create("n1")
    assert store.kv_apply("lock", "l", b"", session=other, now=104.9)[0] is False  # within lock-delay
    assert store.kv_apply("lock", "l", b"", session=other, now=105.1)[0] is True


def test_voluntary_release_has_no_lock_delay():
    store = _store_with_node()
    s1, _ = store.session_create("n1")
    s2, _ = store.session_create("n1")
    store.kv_apply("lock", "l", b"", session=s1, now=0.0)
    store.kv_apply("unlock", "l", b"", session=s1, now=0.0)
    assert store.kv_apply("lock", "l", b"", session=s2, now=0.1)[0] is True


def test_txn_rolls_back_everything_when_a_check_fails():
    store = _store_with_node()
    sid, _ = store.session_create("n1")
    store.kv_apply("lock", "leader", b"me", session=sid)
    store.kv_apply("set", "w", b"old")
    before = (store.index, store.kv_list("")[1])
    result = store.txn([
        {"Verb": "set", "Key": "w", "Value": b"new"},
        {"Verb": "delete", "Key": "leader"},
        {"Verb": "set", "Key": "fresh", "Value": b"x"},
        {"Verb": "check-session", "Key": "leader", "Session": "someone-else"},
    ])
    assert result.commit is None and result.results is None
    assert result.errors[0]["OpIndex"] == 3 and "session" in result.errors[0]["What"]
    assert (store.index, store.kv_list("")[1]) == before
    assert store.kv_get("fresh")[1] is None


def test_txn_results_blank_values_except_get():
    store = Store()
    result = store.txn([{"Verb": "set", "Key": "a", "Value": b"1"}, {"Verb": "get", "Key": "a"},
                        {"Verb": "check-not-exists", "Key": "b"}, {"Verb": "get-tree", "Key": ""}])
    assert result.errors is None
    kinds = [r["KV"]["Value"] for r in result.results]
    assert kinds == [None, b"1", b"1"]  # set -> null, get -> value, check-not-exists -> no result
    assert all(r["KV"]["ModifyIndex"] == result.commit.index for r in result.results)


def test_txn_results_are_bounded_in_values_and_roll_back_past_the_bound():
    store = Store()
    store.kv_apply("set", "a", b"x" * 6)
    before = store.index
    ok = store.txn([{"Verb": "get", "Key": "a"}], max_result_bytes=6)
    assert ok.errors is None and ok.results[0]["KV"]["Value"] == b"x" * 6
    over = store.txn([{"Verb": "set", "Key": "b", "Value": b"1"}, {"Verb": "get", "Key": "a"},
                      {"Verb": "get-tree", "Key": ""}], max_result_bytes=10)
    assert over.results is None and over.errors[0]["OpIndex"] == 2 and "exceed 10 bytes" in over.errors[0]["What"]
    assert store.index == before and store.kv_get("b")[1] is None  # nothing applied


def test_txn_check_index_and_lock_delay():
    store = _store_with_node()
    store.kv_apply("set", "k", b"")
    idx = store.kv_get("k")[0]
    assert store.txn([{"Verb": "check-index", "Key": "k", "Index": idx + 1}]).errors
    assert store.txn([{"Verb": "check-index", "Key": "k", "Index": idx}]).errors is None
    sid, _ = store.session_create("n1", lock_delay_ns=10_000_000_000)
    store.txn([{"Verb": "lock", "Key": "k", "Session": sid}])
    store.session_destroy(sid, now=0.0)
    s2, _ = store.session_create("n1")
    errors = store.txn([{"Verb": "lock", "Key": "k", "Session": s2}], now=1.0).errors
    assert errors and "lock delay" in errors[0]["What"]


def test_node_deregister_invalidates_its_sessions():
    store = _store_with_node()
    sid, _ = store.session_create("n1")
    store.kv_apply("lock", "l", b"", session=sid)
    store.catalog_deregister("n1", now=0.0)
    assert store.session_get(sid) is None and store.kv_get("l")[1]["Session"] == ""


def test_catalog_service_node_meta_filter_and_index():
    store = Store()
    store.catalog_register({"Node": "a", "Address": "198.18.1.2", "Meta": {"az": "az-a"}},
                           {"Service": "azprobe-agent", "Port": 9740, "Tags": ["t"]}, [])
    c = store.catalog_register({"Node": "b", "Address": "198.18.2.2", "Meta": {"az": "az-b"}},
                               {"Service": "azprobe-agent", "Port": 9740}, [])
    idx, rows = store.catalog_service("azprobe-agent", node_meta={"az": "az-b"})
    assert [r["Node"] for r in rows] == ["b"] and idx == c.index
    d = store.catalog_deregister("b", service_id="azprobe-agent")
    assert store.catalog_service("azprobe-agent")[0] == d.index  # a removal moves the index too
    assert store.catalog_services()[1] == {"azprobe-agent": ["t"]}


def test_wal_replay_and_snapshot_rebuild_the_same_state(tmp_path):
    wal = WriteAheadLog(tmp_path)
    wal.load()
    live = Store()
    for write in (lambda s: s.catalog_register({"Node": "n1", "Address": "127.0.0.1"}, None,
                                               [{"CheckID": SERF_CHECK_ID, "Status": "passing"}]),
                  lambda s: s.kv_apply("set", "bin", b"\x00\xff\x10", flags=3)[1],
                  lambda s: s.session_create("n1", session_id="s-1")[1],
                  lambda s: s.kv_apply("lock", "l", b"v", session="s-1")[1],
                  lambda s: s.kv_apply("delete", "bin")[1]):
        wal.append(write(live))
    wal.close()
    assert WriteAheadLog(tmp_path).load().to_snapshot() == live.to_snapshot()

    # a torn tail (a crash mid-append) is dropped, not fatal
    with open(tmp_path / "wal.jsonl", "ab") as f:
        f.write(b'{"i": 99, "m": [["kvs", "tor')
    wal = WriteAheadLog(tmp_path)
    reloaded = wal.load()
    assert reloaded.index == live.index

    # snapshot + truncate, then one more write: the same state after another reload
    wal.snapshot(reloaded)
    wal.append(reloaded.kv_apply("set", "after", b"1")[1])
    wal.close()
    final = WriteAheadLog(tmp_path).load()
    assert final.kv_get("after")[1]["Value"] == b"1"
    assert final.kv_get("l")[1]["Session"] == "s-1"
    assert final.index == reloaded.index == live.index + 1
