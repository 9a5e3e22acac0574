"""Child processes of the demo (agent, controllers) with guaranteed, targeted cleanup.

Each child runs in its own session, so a Ctrl-C in the terminal reaches only the demo,
which then stops its children itself, in order, by pid: never by name.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

from azprobe.errors import PrerequisiteError


def azprobe_argv(*args: str) -> list[str]:
    """Run an azprobe subcommand with this interpreter (the venv), not whatever
    `azprobe` happens to be first on PATH."""
    return [sys.executable, "-m", "azprobe.commands.cli", *args]


class ManagedProcess:
    """One child process whose output goes to a log file."""

    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> "ManagedProcess":
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL now (the failover scenario), and reap."""
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after timeout_s; idempotent."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self) -> None:
        """Raise with the child's last log lines when it died on its own."""
        if self.proc is not None and self.proc.poll() is not None:
            raise PrerequisiteError(f"{self.name} exited with code {self.proc.returncode}; "
                                    f"its log ({self.log_path}) ends with:\n{self.log_tail()}")
