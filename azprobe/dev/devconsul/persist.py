"""Durability for devconsul: an append-only JSON-lines log, one line per commit, fsync'd
before the client gets its answer (Consul's raft log does the same), plus a snapshot that
replaces the log once it grows. Boot = snapshot + log replay, so indexes never go
backwards across a restart. A torn last line (crash mid-write) is dropped, as a raft log
drops an entry that never finished its fsync.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from pathlib import Path
from typing import Any

from azprobe.dev.devconsul.store import Commit, Store

log = logging.getLogger(__name__)

LOG_NAME = "wal.jsonl"
SNAPSHOT_NAME = "snapshot.json"
SNAPSHOT_EVERY = 10_000  # commits in the log before it is folded into a snapshot


def _encode_row(table: str, value: Any) -> Any:
    # KV values are bytes in memory and base64 on disk, exactly as Consul's API shows them
    if table == "kvs" and value is not None:
        return dict(value, Value=base64.b64encode(value["Value"]).decode())
    return value


def _decode_row(table: str, value: Any) -> Any:
    if table == "kvs" and value is not None:
        return dict(value, Value=base64.b64decode(value["Value"]))
    return value


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WriteAheadLog:
    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / LOG_NAME
        self.snapshot_path = self.dir / SNAPSHOT_NAME
        self._records = 0
        self._file: Any = None

    def load(self) -> Store:
        """Rebuild the store from disk; truncates a torn tail so appends stay parseable."""
        if self.snapshot_path.exists():
            snap = json.loads(self.snapshot_path.read_text())
            for table, rows in snap["rows"].items():
                snap["rows"][table] = [[k, _decode_row(table, v)] for k, v in rows]
            store = Store.from_snapshot(snap)
        else:
            store = Store()
        good_bytes = 0
        if self.log_path.exists():
            with open(self.log_path, "rb") as f:
                for line in f:
                    try:
                        record = json.loads(line)
                    except ValueError:
                        log.warning("dropping torn record at byte %d of %s", good_bytes, self.log_path)
                        break
                    if not line.endswith(b"\n"):
                        break
                    if record["i"] > store.index:  # records up to the snapshot are in it
                        store.replay(record["i"], [[t, k, _decode_row(t, v)] for t, k, v in record["m"]])
                    good_bytes += len(line)
                    self._records += 1
            if good_bytes != self.log_path.stat().st_size:
                os.truncate(self.log_path, good_bytes)
        self._file = open(self.log_path, "ab")
        return store

    def append(self, commit: Commit) -> None:
        record = {"i": commit.index, "m": [[t, k, _encode_row(t, v)] for t, k, v in commit.mutations]}
        self._file.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._records += 1

    def should_snapshot(self) -> bool:
        return self._records >= SNAPSHOT_EVERY

    def snapshot(self, store: Store) -> None:
        """Write the full state, then empty the log: tmp + fsync + rename, so a crash at any
        point leaves either the old snapshot + full log or the new snapshot."""
        snap = store.to_snapshot()
        snap["rows"] = {t: [[k, _encode_row(t, v)] for k, v in rows] for t, rows in snap["rows"].items()}
        tmp = self.snapshot_path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(snap, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.snapshot_path)
        _fsync_dir(self.dir)
        self._file.close()
        self._file = open(self.log_path, "wb")  # records up to snap["index"] are in the snapshot
        os.fsync(self._file.fileno())
        self._records = 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
