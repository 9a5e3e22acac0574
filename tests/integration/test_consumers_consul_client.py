"""azprobe.clients.consul against devconsul: fenced transactions with the token, the watch
loop's Consul rules (index reset, 403 and empty recursive reads are errors)."""

from __future__ import annotations

import http.server
import threading

import pytest

from azprobe.clients.consul import (ConsulEmptyPrefix, ConsulError, ConsulPermissionDenied, ConsulSettings, ConsulUnreachable,
                            KeyWatch, TxnConflict, make_client, op_check_session, op_get, op_set,
                            read_key, txn)
from azprobe.dev.devconsul.testing import DevConsul
from tests.helpers import wait_for

TOKEN = "master-token-for-tests"


def test_fenced_txn_writes_only_for_the_lock_holder(devconsul):
    settings = ConsulSettings(address=devconsul.url)
    client = make_client(settings)
    leader_key, weights_key = settings.key("leader"), settings.key("weights")
    holder = client.session.create(name="ctl-1", ttl=30)
    other = client.session.create(name="ctl-2", ttl=30)
    assert client.kv.put(leader_key, "ctl-1", acquire=holder) is True
    results = txn(settings, [op_check_session(leader_key, holder), op_set(weights_key, b'{"g":1}'),
                             op_set(settings.key("weights/from/az-a"), b'{"g":1}'), op_get(weights_key)])
    assert results[-1]["KV"]["Value"] == b'{"g":1}'
    with pytest.raises(TxnConflict) as exc:
        txn(client, [op_check_session(leader_key, other), op_set(weights_key, b'{"g":2}')])
    assert exc.value.errors[0]["OpIndex"] == 0
    assert read_key(client, weights_key).value == b'{"g":1}'  # rolled back: nothing written


def test_txn_sends_the_token():
    with DevConsul(acl_master_token=TOKEN) as dc:
        with pytest.raises(ConsulPermissionDenied, match="denied the transaction"):
            txn(ConsulSettings(address=dc.url), [op_set("k", b"v")])
        txn(ConsulSettings(address=dc.url, token=TOKEN), [op_set("k", b"v")])
        assert read_key(make_client(ConsulSettings(address=dc.url, token=TOKEN)), "k").value == b"v"
        with pytest.raises(ConsulPermissionDenied, match=r"denied reading 'k'.*CONSUL_HTTP_TOKEN"):
            read_key(make_client(ConsulSettings(address=dc.url)), "k")


def test_empty_recursive_read_can_be_an_error(devconsul):
    client = make_client(ConsulSettings(address=devconsul.url))
    assert read_key(client, "nothing/", recurse=True).entries == {}
    with pytest.raises(ConsulEmptyPrefix, match="no keys under 'nothing/'"):
        read_key(client, "nothing/", recurse=True, require_nonempty=True)
    client.kv.put("some/a", b"1")
    assert read_key(client, "some/", recurse=True, require_nonempty=True).entries == {"some/a": b"1"}


def test_unreachable_is_a_clear_error():
    with pytest.raises(ConsulUnreachable, match=r"cannot reach Consul at http://127.0.0.1:1 .*CONSUL_HTTP_ADDR"):
        read_key(make_client(ConsulSettings(address="http://127.0.0.1:1")), "k")


def test_watch_resets_when_the_index_goes_backwards():
    # No data dir: a restart loses every index, so the server's index goes backwards.
    with DevConsul() as dc:
        client = make_client(ConsulSettings(address=dc.url))
        for i in range(5):
            client.kv.put(f"pad/{i}", b"x")
        client.kv.put("k", b"v1")
        watch = KeyWatch(client, "k", wait_s=1.0)
        assert watch.poll().value == b"v1"
        high = watch.index
        assert high >= 6
        dc.kill()
        dc.start()
        client.kv.put("k", b"v2")
        state = watch.poll()  # asks for > high on a server now below it: returns at `wait`
        assert state.index < high and watch.index == 0
        assert watch.poll().value == b"v2" and 0 < watch.index < high


def test_watch_run_delivers_changes_only_and_survives_errors(devconsul):
    client = make_client(ConsulSettings(address=devconsul.url))
    client.kv.put("k", b"v1")
    seen: list[bytes | None] = []
    errors: list[Exception] = []
    stop = threading.Event()
    watch = KeyWatch(client, "k", wait_s=2.0, backoff_base_s=0.05, backoff_cap_s=0.2)
    thread = threading.Thread(target=watch.run, args=(lambda s: seen.append(s.value), stop, errors.append))
    thread.start()
    try:
        wait_for(lambda: seen == [b"v1"], timeout=5, message="the first value")
        client.kv.put("other", b"x")  # bumps the index, not this key's value
        client.kv.put("k", b"v1")     # idempotent write: not a change
        client.kv.put("k", b"v2")
        wait_for(lambda: seen[-1] == b"v2", timeout=5, message="v2")
        assert seen == [b"v1", b"v2"]
        devconsul.kill()
        wait_for(lambda: len(errors) >= 2, timeout=10, message="errors while down")
        devconsul.start()  # same data dir: the value survives
        make_client(ConsulSettings(address=devconsul.url)).kv.put("k", b"v3")
        wait_for(lambda: seen[-1] == b"v3", timeout=10, message="v3 after restart")
        assert isinstance(errors[0], ConsulUnreachable)
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()


class _HostileConsul:
    """A "Consul" on 127.0.0.1 answering every request 200 with the given body."""

    def __init__(self, body: bytes) -> None:
        body_bytes = body

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("X-Consul-Index", "7")
                self.send_header("Content-Length", str(len(body_bytes)))
                self.end_headers()
                self.wfile.write(body_bytes)

            do_GET = do_PUT = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "_HostileConsul":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_deeply_nested_answer_is_a_consul_error_before_py_consul_parses_it():
    with _HostileConsul(b"[" * 100_000 + b"]" * 100_000) as hostile:
        client = make_client(ConsulSettings(address=hostile.url))
        with pytest.raises(ConsulError, match="Consul's answer: JSON nested too deeply"):
            read_key(client, "k")
        with pytest.raises(ConsulError, match="nested too deeply"):
            txn(client, [op_set("k", b"v")])
