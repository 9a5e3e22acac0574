"""SIGHUP to `azprobe weights --watch` and `azprobe envoy-eds --watch` (real processes,
devconsul with ACLs): the process keeps running and re-reads its token file at once.

The token file is rewritten in place with a token of the same length and its mtime put
back, so its identity (inode, size, mtime) is unchanged and the change-on-disk check
cannot see it: only the SIGHUP re-read can. The old token is revoked first, so every
generation read after the signal proves the new token is sent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from azprobe.clients.consul import ConsulSettings, make_client
from azprobe.dev.devconsul.testing import DevConsul
from tests.helpers import make_acl_token, revoke_acl_token, sample_weights_doc, stop_process, wait_for, write_secret

MASTER = "sighup-master-token"
KEY = "azprobe/v1/weights"


def _rewrite_in_place(path: Path, token: str) -> None:
    """The same inode, size and mtime, another token: invisible to the file check."""
    before = os.stat(path)
    with open(path, "r+") as f:
        f.write(token + "\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)


def _generation_shown(command: str, out: Path, err: Path, generation: int) -> bool:
    if command == "weights":
        return any(json.loads(line).get("generation") == generation
                   for line in out.read_text().splitlines() if line.startswith("{"))
    return f"(generation {generation}" in err.read_text()


@pytest.mark.parametrize("command", ["weights", "envoy-eds"])
def test_sighup_keeps_the_watch_running_and_rereads_the_token_file(command, tmp_path):
    with DevConsul(acl_master_token=MASTER) as dc:
        admin = make_client(ConsulSettings(address=dc.url, token=MASTER))
        old_accessor, old = make_acl_token(dc, MASTER, "watch")
        _, new = make_acl_token(dc, MASTER, "watch")
        assert len(old) == len(new)
        token_file = write_secret(tmp_path / "consul.token", old + "\n")
        admin.kv.put(KEY, sample_weights_doc(1, {"az-a": 50, "az-b": 50}).dumps())
        if command == "weights":
            args = ["weights", "--watch", "--json"]
        else:
            endpoints = tmp_path / "endpoints.json"
            endpoints.write_text(json.dumps({"az-a": ["198.18.1.10:8080"], "az-b": ["198.18.2.10:8080"]}))
            args = ["envoy-eds", "--watch", "--cluster", "backend", "--endpoints", str(endpoints),
                    "--out", str(tmp_path / "eds.json")]
        out, err = tmp_path / "stdout", tmp_path / "stderr"
        with open(out, "w") as stdout, open(err, "w") as stderr:
            proc = subprocess.Popen([sys.executable, "-m", "azprobe.commands.cli", *args, "--consul", dc.url],
                                    stdout=stdout, stderr=stderr, text=True,
                                    env={**os.environ, "CONSUL_HTTP_TOKEN_FILE": str(token_file)})
        try:
            wait_for(lambda: _generation_shown(command, out, err, 1), timeout=15, message="generation 1 shown")
            _rewrite_in_place(token_file, new)
            revoke_acl_token(dc, MASTER, old_accessor)
            proc.send_signal(signal.SIGHUP)
            wait_for(lambda: "SIGHUP: " in err.read_text() or proc.poll() is not None, timeout=10,
                     message="the SIGHUP re-read logged")
            assert proc.poll() is None, err.read_text()
            assert "rotated file(s) taken" in err.read_text() and "SIGHUP: 0 " not in err.read_text()
            # A query under way when the token was revoked may still answer once: the one
            # after it is made with the token the SIGHUP read.
            admin.kv.put(KEY, sample_weights_doc(2, {"az-a": 30, "az-b": 70}).dumps())
            wait_for(lambda: _generation_shown(command, out, err, 2), timeout=15, message="generation 2 shown")
            admin.kv.put(KEY, sample_weights_doc(3, {"az-a": 60, "az-b": 40}).dumps())
            wait_for(lambda: _generation_shown(command, out, err, 3), timeout=15,
                     message="generation 3 read with the new token")
            assert proc.poll() is None
            assert old not in err.read_text() and new not in err.read_text()
        finally:
            stop_process(proc)
