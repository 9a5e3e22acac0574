"""`azprobe doctor --role controller` against a Consul whose Date header is not an HTTP
date: the skew check warns naming the header, and doctor goes on (no traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from tests.helpers import serve_http

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def consul_dated(date: str) -> Iterator[str]:
    """A leader answer for every GET, stamped with `date`; 403 for the ACL writes."""

    class Handler(BaseHTTPRequestHandler):
        def date_time_string(self, timestamp=None):  # noqa: ARG002 - the header under test
            return date

        def do_GET(self) -> None:  # noqa: N802
            body = b'"10.0.0.1:8300"'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_PUT(self) -> None:  # noqa: N802
            self.send_response(403)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    with serve_http(Handler) as url:
        yield url


def test_a_garbage_date_header_is_a_warning_not_a_crash():
    with consul_dated("\x1b[31mgarbage") as url:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("CONSUL_")}, "CONSUL_HTTP_ADDR": url}
        result = subprocess.run([sys.executable, "-m", "azprobe.commands.cli", "doctor", "--role", "controller"],
                                capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert "Traceback" not in result.stderr, result.stderr
    assert ('! consul.clock_skew: Consul\'s Date header "\\x1b[31mgarbage" is not an HTTP date: '
            "cannot measure clock skew") in result.stdout.splitlines()
    assert "\x1b" not in result.stdout
    assert result.stdout.splitlines()[-1].startswith("NOT ready")  # the ACL writes were refused
    assert result.returncode == 1
