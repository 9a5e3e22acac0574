"""`azprobe trace` against a peer that is not a well-behaved agent: a malformed /v1/events
answer is one line naming the field and exit 1, as `azprobe top` treats a bad answer; a
bad --agent is a usage error (exit 2), as for `top`."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from tests.helpers import serve_http

ROOT = Path(__file__).resolve().parents[2]
EVENT = {"id": 1, "ts": 1700000000.5, "kind": "conn_refused", "src": "az-a", "dst": "az-b",
         "saddr": "198.18.1.2", "sport": 40000, "daddr": "198.18.2.2", "dport": 443}


@contextmanager
def peer(body: bytes, events: list | None = None) -> Iterator[str]:
    """Answers every GET with `body`; with `events`, a /v1/events answer holding those after
    `after`, the first answer only the first event (the ring's history), later ones all."""
    asked = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            out = body
            if events is not None:
                after = int(urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)["after"][0])
                seen = events if asked else events[:1]
                asked.append(after)
                out = json.dumps({"node": "node-a1", "az": "az-a", "boot_id": "b-1",
                                  "events": [e for e in seen if e["id"] > after]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args) -> None:
            pass

    with serve_http(Handler) as url:
        yield url


def azprobe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "azprobe.commands.cli", *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


@pytest.mark.parametrize(("body", "field"), [
    (b"[]", "response: expected a JSON object"),
    (b'{"boot_id":"b","events":[{"x":1}]}', "events[0].ts:"),
    (b'{"boot_id":"b","events":"abc"}', "events: expected a list"),
    (b'{"boot_id":"b","events":[{"id":"zz"}]}', "events[0].ts:"),
    (b'{"boot_id":"b","events":[{"id":"zz","ts":1}]}', "events[0].id:"),
    (b'{"events":[]}', "response: boot_id"),
    (b'{"node":"\\u001b[31mevil","boot_id":"b","events":[]}', "response: node"),
])
def test_a_malformed_answer_is_one_line_and_exit_1(body, field):
    with peer(body) as url:
        result = azprobe("trace", "--agent", url, "--duration", "1")
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == [result.stderr.rstrip("\n")], result.stderr  # one line, no traceback
    assert result.stderr.startswith(f"azprobe: agent {url} sent a bad response: {field}"), result.stderr
    assert "\x1b" not in result.stderr + result.stdout


@pytest.mark.parametrize("as_json", [True, False])
def test_a_good_answer_prints_each_new_event_once(as_json):
    second = {**EVENT, "id": 2, "kind": "rto", "dport": 80}
    with peer(b"", events=[EVENT, second]) as url:
        result = azprobe("trace", "--agent", url, "--duration", "0.5", "--poll", "0.1",
                         *(["--json"] if as_json else []))
    assert result.returncode == 0, result.stderr
    # trace starts from now: the first answer's event is history, not printed
    [line] = result.stdout.splitlines()
    if as_json:
        assert json.loads(line) == second
    else:
        assert line.endswith(" rto           az-a -> az-b       198.18.1.2:40000 -> 198.18.2.2:80")
        assert result.stderr == "tracing node-a1 (az az-a): TIME KIND PATH ADDRESSES\n"


def test_a_bad_agent_url_is_a_usage_error_as_for_top():
    traced, topped = azprobe("trace", "--agent", "notaurl", "--duration", "1"), azprobe("top", "--agent", "notaurl",
                                                                                       "--once")
    assert traced.returncode == topped.returncode == 2
    assert traced.stderr == topped.stderr == ("azprobe: --agent: 'notaurl' is not an http(s) URL "
                                              "(for example http://127.0.0.1:9740)\n")
