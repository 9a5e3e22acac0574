"""Errors an operator sees. Each carries the exit code the CLI returns."""

from __future__ import annotations

EXIT_USAGE = 2  # bad flags, bad config: the operator must fix the input
EXIT_RUNTIME = 1  # a prerequisite or a dependency failed at run time


class AzprobeError(Exception):
    """An error with a one-line message that says what is wrong and how to fix it."""

    exit_code = EXIT_RUNTIME


class ConfigError(AzprobeError):
    """Bad configuration or usage; `field` names the offending key."""

    exit_code = EXIT_USAGE

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        message = f"{field}: {problem}"
        if fix:
            message += f" ({fix})"
        super().__init__(message)


class PrerequisiteError(AzprobeError):
    """The machine lacks something azprobe needs (BTF, tracefs, root, ...)."""
