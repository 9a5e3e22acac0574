"""The BCC C programs (kernel side) and the constants they share with Python."""

from __future__ import annotations

import functools
import re
from pathlib import Path

PROGRAM = "azprobe.bpf.c"
EMPTY_PROGRAM = "empty.bpf.c"
HEADER = "azprobe.h"  # shared with Python; BPF-only helpers: azprobe.bpf.h

_DEFINE = re.compile(r"^#define\s+(AZP_\w+)\s+(\d+)\b", re.MULTILINE)


def source_dir() -> Path:
    """Directory holding the .bpf.c programs and azprobe.h (passed to BCC as -I)."""
    return Path(__file__).resolve().parent


@functools.cache
def header_constants() -> dict[str, int]:
    """The integer `#define AZP_*` constants of azprobe.h, so Python never copies them."""
    text = (source_dir() / HEADER).read_text()
    return {name: int(value) for name, value in _DEFINE.findall(text)}


def constant(name: str) -> int:
    """One constant of azprobe.h by its name without the AZP_ prefix, e.g. "MAX_AZ"."""
    return header_constants()["AZP_" + name]
