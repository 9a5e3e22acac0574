"""The one bounded JSON decoder: refuses too deep, too large, not UTF-8 and not JSON with
one exception type and one line naming the input; counts nesting without recursing,
strings (with their brackets, escaped quotes and backslashes) ignored."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from azprobe.contracts.bounded_json import MAX_DEPTH, JsonRefused, check, loads, nesting_depth

BIG = 1 << 20


def _nested(depth: int, inner: str = "1") -> str:
    """`depth` levels alternating arrays and objects around `inner`."""
    text = inner
    for level in range(depth):
        text = f"[{text}]" if level % 2 else f'{{"k": {text}}}'
    return text


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


def test_depth_at_the_bound_is_read_one_more_is_refused():
    assert _depth(loads(_nested(MAX_DEPTH), max_bytes=BIG, what="doc")) == MAX_DEPTH
    with pytest.raises(JsonRefused, match=rf"^doc: JSON nested too deeply \({MAX_DEPTH + 1} levels"):
        loads(_nested(MAX_DEPTH + 1), max_bytes=BIG, what="doc")


@pytest.mark.parametrize("text", [
    "[" * 100_000 + "]" * 100_000,  # 200 KB, the weights-key attack
    "[" * 200_000,  # never closed: json.loads would recurse before it saw the end
    '{"a":' * 50_000 + "1" + "}" * 50_000,
])
def test_deep_input_is_refused_not_a_recursion_error(text):
    with pytest.raises(JsonRefused, match="nested too deeply") as refused:
        loads(text, max_bytes=BIG, what="weights document")
    assert "\n" not in str(refused.value) and str(refused.value).startswith("weights document: ")


@pytest.mark.parametrize("text", [
    '["' + "[" * 1000 + '"]',  # brackets inside a string are text
    '{"' + "{" * 500 + '": "' + "]" * 500 + '"}',
    '["\\"' + "[" * 500 + '"]',  # an escaped quote does not end the string
    '["a\\\\\\"' + "[" * 500 + '"]',  # \\ then \": still inside
])
def test_brackets_inside_strings_do_not_count(text):
    assert loads(text, max_bytes=BIG, what="doc") == json.loads(text)


def test_a_string_ended_after_an_escaped_backslash_leaves_the_brackets_after_it_counted():
    text = '["\\\\", ' + _nested(MAX_DEPTH) + "]"  # "\\" is a whole string: the nesting is real
    with pytest.raises(JsonRefused, match="nested too deeply"):
        loads(text, max_bytes=BIG, what="doc")


def test_size_bound_in_bytes():
    doc = '{"a": "' + "é" * 10 + '"}'  # 10 two-byte characters
    size = len(doc.encode())
    assert loads(doc, max_bytes=size, what="doc") == {"a": "é" * 10}
    assert loads(doc.encode(), max_bytes=size, what="doc") == {"a": "é" * 10}
    for data in (doc, doc.encode()):
        with pytest.raises(JsonRefused, match=f"^doc of {size} bytes exceeds the limit of {size - 1}$"):
            loads(data, max_bytes=size - 1, what="doc")


@pytest.mark.parametrize("data, problem", [
    (b'{"a": 1', "not valid JSON: Expecting ',' delimiter at line 1 column 8"),
    (b"", "not valid JSON: Expecting value at line 1 column 1"),
    (b'["' + b"[" * 100, "not valid JSON: Unterminated string"),  # an open string hides nothing
    (b'{"a": "\xff"}', "not UTF-8 at byte 7"),
    (b"[" + b"9" * 5000 + b"]", "not valid JSON: Exceeds the limit"),  # the interpreter's own digit bound
    (b'{"end": -1' + b"0" * 400 + b"}", "an integer of 401 digits"),  # float() of it overflows
])
def test_every_refusal_is_one_exception_and_one_line(data, problem):
    with pytest.raises(JsonRefused) as refused:
        loads(data, max_bytes=BIG, what="page")
    assert isinstance(refused.value, ValueError)
    assert str(refused.value).startswith("page: " + problem) and "\n" not in str(refused.value)


def test_integers_a_float_holds_are_read_and_longer_ones_refused():
    # the readers check ranges and name the field; what a float cannot hold never reaches them
    read = loads(f"[{2**64 - 1}, {-(10**308 - 1)}, 0, -0]", max_bytes=BIG, what="doc")
    assert read == [2**64 - 1, -(10**308 - 1), 0, 0] and float(read[1]) == -1e308
    assert loads(f"[{10**308}]", max_bytes=BIG, what="doc") == [10**308]  # 309 digits, still a float's
    for text in (f"[{2 * 10**308}]", f"[{-(10**309)}]"):
        with pytest.raises(JsonRefused, match=r"^doc: an integer of 3(09|10) digits, more than a float holds$"):
            loads(text, max_bytes=BIG, what="doc")
    assert loads("[1e400]", max_bytes=BIG, what="doc") == [float("inf")]  # a float, for the readers' own checks


def test_hook_errors_pass_through_unchanged():
    class Mine(ValueError):
        pass

    def reject(name: str) -> float:
        raise Mine(name)

    with pytest.raises(Mine):
        loads("[NaN]", max_bytes=BIG, what="doc", parse_constant=reject)


def test_check_returns_the_text_for_another_parser():
    assert check(b'{"a": "[["}', max_bytes=BIG, what="answer") == '{"a": "[["}'
    with pytest.raises(JsonRefused, match="^answer: JSON nested too deeply"):
        check(b"[" * 5000, max_bytes=BIG, what="answer")


_TEXT = st.text(alphabet=st.sampled_from('[]{}"\\ab/é\n'), max_size=8)
_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-(10**308) + 1, 10**308 - 1) | _TEXT,
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
                       max_leaves=40)


@settings(max_examples=300, deadline=None)
@given(value=_VALUES, indent=st.sampled_from([None, 1]))
def test_nesting_depth_is_the_documents_depth(value, indent):
    """Any JSON document, strings full of brackets, quotes and backslashes: the scan
    counts exactly the structure's depth, and loads reads it back unchanged."""
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    assert nesting_depth(text.encode()) == _depth(value)
    assert loads(text, max_bytes=BIG, what="doc") == value
