"""Go's time.ParseDuration, because Consul takes every duration ("10s", "1m30s",
"15000000000" as ns in some fields) in Go's syntax and clients send exactly that."""

from __future__ import annotations

import re
from functools import lru_cache

_UNITS_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
             "m": 60_000_000_000, "h": 3_600_000_000_000}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


@lru_cache(maxsize=256)  # watchers send the same "30s" thousands of times a second
def parse_go_duration_ns(text: str) -> int:
    """"1m30s" -> 90_000_000_000. Raises ValueError with Go's wording on bad input."""
    shown = text if len(text) <= 64 else text[:61] + "..."  # errors echo the input, bounded
    s = text.strip()
    sign = 1
    if s[:1] in "+-" and s:
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError(f'time: invalid duration "{shown}"')
    total = 0.0
    pos = 0
    for match in _PART.finditer(s):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS_NS[match.group(2)]
        pos = match.end()
    if pos != len(s) or pos == 0:
        if re.fullmatch(r"[\d.]+", s):
            raise ValueError(f'time: missing unit in duration "{shown}"')
        raise ValueError(f'time: invalid duration "{shown}"')
    if not total < 2**63:  # Go: "time: invalid duration" on int64 overflow (also inf from 1e400-ish digits)
        raise ValueError(f'time: invalid duration "{shown}"')
    return sign * int(round(total))

