"""The one JSON decoder for input from the network, Consul KV or an operator's file.

`json.loads` recurses once per nesting level, so 200 KB of `[[[...` raises
RecursionError, which no ValueError handler catches. `loads` measures the nesting first,
without recursing, and refuses input nested deeper than MAX_DEPTH (or larger than the
caller's size bound) before `json.loads` sees it. Every failure, also not-JSON, is one
exception type, JsonRefused (a ValueError), with a one-line message naming what was read.

The depth scan is a few passes of bytes methods (C speed): drop escaped backslashes and
quotes, keep only quotes and brackets, drop the strings, then peel the innermost bracket
pairs level by level. For a prefix json.loads can parse, the brackets counted are exactly
its brackets; past the first syntax error json.loads stops, so nothing there can recurse.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from itertools import accumulate
from typing import Any

# The deepest document azprobe reads is a JSON windows page, 7 levels (page, windows,
# window, paths, path, histogram, counts); a Prometheus answer is 6, a weights document 4.
# Four times the deepest, and far below the ~1000 levels of the interpreter's recursion
# limit.
MAX_DEPTH = 32

# JSON integers have no bound, and float() of one past 1.8e308 raises OverflowError,
# which no ValueError handler catches. Those a float holds reach the reader's own checks,
# which name the field ("generation: out of range"). Up to this many digits, any does.
MAX_INT_DIGITS = 308

_QUOTES_AND_BRACKETS = b'"[]{}'
_DROP = bytes(b for b in range(256) if b not in _QUOTES_AND_BRACKETS)
PARENS = bytes.maketrans(b"[]{}", b"()()")  # bytes.translate table: brackets to parens
_STRING = re.compile(rb'"[^"]*(?:"|\Z)')  # an unterminated string runs to the end
_STEP = [0] * 256
_STEP[ord("(")], _STEP[ord(")")] = 1, -1


class JsonRefused(ValueError):
    """Input refused by `loads`: too large, not UTF-8, nested too deeply, or not JSON."""


def _parens(data: bytes) -> bytes:
    """The brackets of UTF-8 JSON text outside its strings, as "(" and ")"."""
    if b"\\" in data:
        # In a JSON string a run of backslashes escapes pairwise from its left end, as
        # replace() pairs them; a backslash left over escapes the character after it.
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    marks = data.translate(None, _DROP)
    # Two quotes side by side open and close a string without brackets, or close one and
    # open the next with none between: either way nothing to count, and what remains
    # still alternates open, close. Most strings hold no bracket, so little remains.
    marks = marks.replace(b'""', b"")
    if b'"' in marks:
        marks = _STRING.sub(b"", marks)
    return marks.translate(PARENS)


def nesting_depth(data: bytes) -> int:
    """How deeply the brackets of UTF-8 JSON text nest (0 for a scalar)."""
    return max(accumulate(map(_STEP.__getitem__, _parens(data))), default=0)


def depth_over(parens: bytes, max_depth: int) -> int | None:
    """The nesting depth of `parens` (only "(" and ")") when it exceeds max_depth, else
    None. Balanced text of depth d is decided in d cheap passes that peel the innermost
    pairs; only text that is too deep or malformed is counted bracket by bracket. Also
    for another syntax's parser, once its strings and comments are dropped."""
    rest = parens
    for _ in range(max_depth):
        if not rest:
            return None
        peeled = rest.replace(b"()", b"")
        if len(peeled) == len(rest):
            break
        rest = peeled
    if not rest:
        return None
    depth = max(accumulate(map(_STEP.__getitem__, parens)), default=0)
    return depth if depth > max_depth else None


def int_parser(what: str) -> Callable[[str], int]:
    """json's parse_int hook: the integers a float holds, else JsonRefused naming `what`."""
    def parse(text: str) -> int:
        value = int(text)  # past the interpreter's 4,300 digits a ValueError: loads refuses it
        if len(text) > MAX_INT_DIGITS:
            try:
                float(value)
            except OverflowError:
                raise JsonRefused(f"{what}: an integer of {len(text.lstrip('-'))} digits, more than a float holds") \
                    from None
        return value
    return parse


def check(data: bytes | bytearray | memoryview | str, *, max_bytes: int, what: str,
          max_depth: int = MAX_DEPTH) -> str:
    """The text of `data` when json.loads may safely read it: at most `max_bytes` UTF-8
    bytes nested at most `max_depth` deep. For a JSON parser not called here (a
    library's); raises JsonRefused naming `what`."""
    if isinstance(data, str):
        raw = data.encode("utf-8", "surrogatepass")
        text = data
    else:
        raw = bytes(data)
    if len(raw) > max_bytes:
        raise JsonRefused(f"{what} of {len(raw)} bytes exceeds the limit of {max_bytes}")
    if not isinstance(data, str):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonRefused(f"{what}: not UTF-8 at byte {exc.start}") from None
    depth = depth_over(_parens(raw), max_depth)
    if depth is not None:
        raise JsonRefused(f"{what}: JSON nested too deeply ({depth} levels, the limit is {max_depth})")
    return text


def loads(data: bytes | bytearray | memoryview | str, *, max_bytes: int, what: str,
          max_depth: int = MAX_DEPTH, parse_constant: Callable[[str], Any] | None = None,
          object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """Decode JSON of at most `max_bytes` (UTF-8) bytes nested at most `max_depth` deep.
    `what` names the input in the refusal ("weights document", "request body", ...).
    Raises JsonRefused for any input it does not decode, also an integer a float cannot
    hold; the hooks' own exceptions pass through unchanged."""
    text = check(data, max_bytes=max_bytes, what=what, max_depth=max_depth)
    try:
        return json.loads(text, parse_int=int_parser(what), parse_constant=parse_constant,
                          object_pairs_hook=object_pairs_hook)
    except json.JSONDecodeError as exc:
        raise JsonRefused(f"{what}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:
        if type(exc) is not ValueError:  # a hook's own error (a ValueError subclass)
            raise
        # e.g. an integer literal past the interpreter's 4,300 digits
        raise JsonRefused(f"{what}: not valid JSON: {str(exc)[:80]}") from None
