"""Start lab processes inside namespaces and wait until they say they are ready."""

from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from azprobe.errors import PrerequisiteError
from azprobe.dev.lab.netns import kill_pids, ns_argv

READY_TIMEOUT_S = 15.0


def spawn_in_ns(ns: str, argv: Sequence[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start argv inside `ns` in its own session (a Ctrl-C on the caller's terminal must not
    kill a lab that outlives `lab up`); stderr goes to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(ns_argv(ns, argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=log, start_new_session=True)


def wait_ready(procs: Sequence[subprocess.Popen[bytes]], logs: Sequence[Path],
               timeout: float = READY_TIMEOUT_S) -> None:
    """Wait for every process to print "ready"; on failure kill them all and explain."""
    pending = {p.stdout.fileno(): (p, log) for p, log in zip(procs, logs) if p.stdout is not None}
    buffers: dict[int, bytes] = {fd: b"" for fd in pending}
    deadline = time.monotonic() + timeout
    try:
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                p, log = next(iter(pending.values()))
                raise PrerequisiteError(f"lab process {' '.join(map(str, p.args))} did not start within "
                                        f"{timeout:g} s (log: {log})")
            readable, _, _ = select.select(list(pending), [], [], left)
            for fd in readable:
                chunk = os.read(fd, 4096)
                p, log = pending[fd]
                if not chunk:
                    p.wait(timeout=5)
                    tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
                    raise PrerequisiteError(f"lab process {' '.join(map(str, p.args))} exited with "
                                            f"{p.returncode} before it was ready: {' | '.join(tail)} (log: {log})")
                buffers[fd] += chunk
                if b"ready\n" in buffers[fd]:
                    del pending[fd]
    except BaseException:
        kill_pids([p.pid for p in procs])
        raise
    finally:
        for p in procs:
            if p.stdout is not None:
                p.stdout.close()
