"""Where a lab remembers itself: a JSON state file, a lock, and an address-slot claim.

The state file is a convenience (pids, current faults); teardown never depends on it,
because a crashed `lab up` may not have written it. Slot claims live in one shared
directory so two labs never pick the same /20 (see topology.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from azprobe.errors import ConfigError
from azprobe.dev.lab.topology import DEFAULT_NAME, LAB_SLOTS

STATE_FILE = "state.json"
AGENT_CONFIG_FILE = "agent.toml"
NODE_AGENT_CONFIG_DIR = "agents"  # one <client node>.toml per node
CLAIM_DIR = Path("/run/azprobe-lab-slots")
NETNS_DIR = Path("/run/netns")
# A claim whose lab has no router namespace yet may belong to a `lab up` in progress.
CLAIM_GRACE_S = 60.0


def default_state_dir(name: str) -> Path:
    """/run/azprobe-lab for the default lab, /run/azprobe-lab-<name> for the others."""
    return Path("/run/azprobe-lab") if name == DEFAULT_NAME else Path(f"/run/azprobe-lab-{name}")


def read_state(state_dir: Path) -> dict[str, Any]:
    path = state_dir / STATE_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError("state-dir", f"no lab state in {state_dir}",
                          "run `azprobe lab up` first, or pass the --state-dir/--name it used") from None
    except json.JSONDecodeError as exc:
        raise ConfigError("state-dir", f"{path} is not valid JSON ({exc})",
                          "run `azprobe lab down --name NAME` to clean up") from None


def write_state(state_dir: Path, state: dict[str, Any]) -> None:
    """Atomic replace, so a concurrent `lab status` never reads half a file."""
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = state_dir / f".{STATE_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, state_dir / STATE_FILE)


@contextlib.contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    """Serialise changes to one lab (a test and a CLI call may both touch it)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _claim_owner(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


def _claim_is_stale(path: Path, owner: str | None) -> bool:
    if owner and (NETNS_DIR / f"{owner}-router").exists():
        return False
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return True
    return age > CLAIM_GRACE_S


def claim_slot(name: str, index: int | None = None) -> int:
    """Reserve an address slot for lab `name` (the given one, or the lowest free one)."""
    CLAIM_DIR.mkdir(parents=True, exist_ok=True)
    candidates = [index] if index is not None else list(range(LAB_SLOTS))
    # A lab that is already up keeps its slot.
    for i in range(LAB_SLOTS):
        if _claim_owner(CLAIM_DIR / str(i)) == name and (index is None or index == i):
            return i
    for i in candidates:
        path = CLAIM_DIR / str(i)
        for _ in range(2):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                owner = _claim_owner(path)
                if _claim_is_stale(path, owner):
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                    continue
                break
            with os.fdopen(fd, "w") as fh:
                fh.write(name + "\n")
            return i
    if index is not None:
        raise ConfigError("index", f"address slot {index} is used by lab {_claim_owner(CLAIM_DIR / str(index))!r}",
                          "pick another --index or leave it unset")
    raise ConfigError("name", f"all {LAB_SLOTS} lab address slots are in use",
                      f"take a lab down (claims are in {CLAIM_DIR})")


def release_slots(name: str) -> None:
    """Drop every slot claimed by `name` (idempotent)."""
    if not CLAIM_DIR.is_dir():
        return
    for path in CLAIM_DIR.iterdir():
        if _claim_owner(path) == name:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
