"""Blocking queries on devconsul: they return soon after a change, time out at `wait`
with the same index, and keep working across a crash + restart with --data-dir (the
index never goes backwards, data intact)."""

from __future__ import annotations

import threading
import time

import consul

from tests.helpers import wait_for


def _client(dc) -> consul.Consul:
    return consul.Consul(host=dc.host, port=dc.port)


def _blocking_get_in_thread(dc, key: str, index: str, wait: str = "30s", **kwargs):
    result: dict[str, object] = {}

    def run() -> None:
        result["value"] = _client(dc).kv.get(key, index=index, wait=wait, **kwargs)
        result["at"] = time.monotonic()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_blocking_get_returns_soon_after_a_change(devconsul):
    client = _client(devconsul)
    client.kv.put("w/key", "1")
    index, _ = client.kv.get("w/key")
    thread, result = _blocking_get_in_thread(devconsul, "w/key", index, wait="10m")
    wait_for(lambda: devconsul.parked_queries() == 1, timeout=5, message="watcher parked server-side")
    assert thread.is_alive(), "blocking query returned without a change"
    # A 10-minute wait: the query can only return within the join's deadline because the
    # write woke it (how fast is a figure for bench/consul_watch.py, not an assertion).
    client.kv.put("w/key", "2")
    thread.join(timeout=60)
    assert not thread.is_alive(), "the write did not wake the blocking query"
    new_index, entry = result["value"]
    assert entry["Value"] == b"2" and int(new_index) > int(index)


def test_recursive_watch_wakes_on_delete_under_prefix(devconsul):
    client = _client(devconsul)
    client.kv.put("tree/a", "1")
    client.kv.put("tree/b", "1")
    index, _ = client.kv.get("tree/", recurse=True)
    thread, result = _blocking_get_in_thread(devconsul, "tree/", index, recurse=True)
    wait_for(lambda: devconsul.parked_queries() == 1, timeout=5, message="watcher parked server-side")
    client.kv.put("elsewhere", "x")  # outside the prefix: must not wake the watcher
    assert devconsul.parked_queries() == 1 and thread.is_alive()
    client.kv.delete("tree/b")
    thread.join(timeout=5)
    new_index, entries = result["value"]
    assert [e["Key"] for e in entries] == ["tree/a"] and int(new_index) > int(index)


def test_blocking_get_times_out_at_wait(devconsul):
    client = _client(devconsul)
    client.kv.put("idle", "1")
    index, _ = client.kv.get("idle")
    # Beside it, the same query with a 10-minute wait: the 1 s one must come back on its
    # own while the long one stays parked (an ordering, not a stopwatch).
    long_wait, long_result = _blocking_get_in_thread(devconsul, "idle", index, wait="10m")
    wait_for(lambda: devconsul.parked_queries() == 1, timeout=5, message="the long query parked")
    started = time.monotonic()
    new_index, entry = client.kv.get("idle", index=index, wait="1s")
    assert time.monotonic() - started >= 1.0  # not before its wait (a lower bound)
    assert new_index == index and entry["Value"] == b"1"
    assert long_wait.is_alive() and devconsul.parked_queries() == 1 and "value" not in long_result
    client.kv.put("idle", "2")  # release the long one
    long_wait.join(timeout=60)
    assert not long_wait.is_alive()


def test_index_zero_and_stale_index_return_at_once(devconsul):
    client = _client(devconsul)
    client.kv.put("now", "1")
    # With a 10-minute wait, returning within the joins' deadlines means not blocking at all.
    thread, result = _blocking_get_in_thread(devconsul, "now", 0, wait="10m")
    thread.join(timeout=60)
    assert not thread.is_alive(), "index 0 blocked"
    index, _ = result["value"]
    client.kv.put("now", "2")
    thread, result = _blocking_get_in_thread(devconsul, "now", index, wait="10m")  # already past
    thread.join(timeout=60)
    assert not thread.is_alive(), "a stale index blocked"
    assert result["value"][1]["Value"] == b"2"


def test_restart_with_data_dir_keeps_data_and_index(devconsul):
    client = _client(devconsul)
    for i in range(5):
        client.kv.put(f"persist/k{i}", f"v{i}")
    sid = client.session.create(lock_delay=0, ttl=60)
    client.kv.put("persist/lock", "me", acquire=sid)
    index, entries = client.kv.get("persist/", recurse=True)
    devconsul.kill()  # a crash: only fsync'd commits survive
    devconsul.start()
    index2, entries2 = client.kv.get("persist/", recurse=True)
    assert index2 == index and entries2 == entries
    assert client.session.info(sid)[1]["ID"] == sid
    # a watcher holding the pre-crash index blocks, then sees the next write,
    # whose index is above everything before the restart
    thread, result = _blocking_get_in_thread(devconsul, "persist/", index, recurse=True)
    wait_for(lambda: devconsul.parked_queries() == 1, timeout=5, message="watcher parked server-side")
    client.kv.put("persist/k0", "after-restart")
    thread.join(timeout=5)
    new_index, new_entries = result["value"]
    assert int(new_index) > int(index)
    assert {e["Key"]: e["Value"] for e in new_entries}["persist/k0"] == b"after-restart"
    devconsul.stop()  # a clean stop works too
    devconsul.start()
    assert int(client.kv.get("persist/", recurse=True)[0]) == int(new_index)


def test_hundreds_of_parked_watchers_cost_no_threads(devconsul):
    """200 long-polls parked at once: the server holds them as futures (its thread count
    stays flat), and one write answers every one of them."""
    import asyncio

    import aiohttp
    import psutil

    client = _client(devconsul)
    client.kv.put("fan/out", "0")
    index, _ = client.kv.get("fan/out")
    threads_idle = psutil.Process(devconsul.pid).num_threads()

    async def run() -> list[bytes]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            async def watch() -> bytes:
                url = f"{devconsul.url}/v1/kv/fan/out?index={index}&wait=30s&raw"
                async with session.get(url) as resp:
                    return await resp.read()

            tasks = [asyncio.create_task(watch()) for _ in range(200)]
            deadline = asyncio.get_running_loop().time() + 20
            while devconsul.parked_queries() < 200:
                assert asyncio.get_running_loop().time() < deadline, "watchers did not park"
                await asyncio.sleep(0.02)
            assert psutil.Process(devconsul.pid).num_threads() <= threads_idle + 2
            await asyncio.to_thread(client.kv.put, "fan/out", "1")
            return await asyncio.wait_for(asyncio.gather(*tasks), timeout=20)

    assert asyncio.run(run()) == [b"1"] * 200
    assert devconsul.parked_queries() == 0
