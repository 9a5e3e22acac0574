"""atomic_write: the target is always the old or the new content, never partial."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from azprobe.consumers.envoy import atomic_write

OLD = b"old-" * 1000
NEW = b"new-" * 250_000  # 1 MB: large enough that a torn write would be visible


def leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_write_replaces_and_leaves_no_temp(tmp_path):
    target = tmp_path / "eds.json"
    atomic_write(target, OLD)
    atomic_write(target, NEW, mode=0o640)
    assert target.read_bytes() == NEW
    assert (target.stat().st_mode & 0o777) == 0o640
    assert leftovers(tmp_path) == []


def test_failure_between_write_and_rename_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "eds.json"
    atomic_write(target, OLD)

    def fail_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail_replace)
    with pytest.raises(OSError, match="No space"):
        atomic_write(target, NEW)
    assert target.read_bytes() == OLD
    assert leftovers(tmp_path) == []


WRITER = textwrap.dedent("""
    import os, sys
    from azprobe.consumers import envoy
    real_fsync = os.fsync
    def fsync_then_hang(fd):
        real_fsync(fd)
        # The new bytes are written and synced to the temp file, not yet renamed:
        # tell the test, then wait to be killed.
        sys.stdout.write("synced\\n"); sys.stdout.flush()
        sys.stdin.read()
    os.fsync = fsync_then_hang
    envoy.atomic_write(sys.argv[1], b"new-" * 250_000)
""")


def test_writer_killed_mid_write_leaves_the_old_file(tmp_path):
    target = tmp_path / "eds.json"
    atomic_write(target, OLD)
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"synced\n"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert target.read_bytes() == OLD
    # The killed writer's temp file may remain; it is never the target Envoy reads.
    assert all(name.startswith(".eds.json.") for name in leftovers(tmp_path))
