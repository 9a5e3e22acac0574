import json
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from azprobe.config import MAX_FILE_BYTES, Section, load_toml, parse_host_port, parse_toml, parse_topology
from azprobe.contracts.bounded_json import MAX_DEPTH
from azprobe.errors import ConfigError


def test_unknown_key_names_the_field():
    s = Section({"interval_s": 1, "intervl": 2}, "agent")
    s.number("interval_s", 1.0)
    with pytest.raises(ConfigError, match=r"agent\.intervl: unknown key") as exc:
        s.reject_unknown()
    assert exc.value.exit_code == 2


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_toml(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[agent\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_toml(bad)


def test_topology_rejects_bad_cidr_and_overlap():
    with pytest.raises(ConfigError, match=r"topology\.az-a: bad CIDR"):
        parse_topology(Section({"az-a": ["198.18.0.0/33"]}, "topology"))
    with pytest.raises(ConfigError, match="overlaps"):
        parse_topology(Section({"az-a": ["198.18.0.0/16"], "az-b": ["198.18.1.0/24"]}, "topology"))
    topo = parse_topology(Section({"az-a": ["198.18.1.0/24", "2001:2::/64"], "az-b": ["198.18.2.0/24"]}, "topology"))
    assert [str(n) for n in topo["az-a"]] == ["198.18.1.0/24", "2001:2::/64"]


def test_host_port():
    assert parse_host_port("127.0.0.1:9740", "x") == ("127.0.0.1", 9740)
    assert parse_host_port("[::1]:80", "x") == ("::1", 80)
    with pytest.raises(ConfigError):
        parse_host_port("nope", "agent.listen")


# --- TOML nesting: bounded before tomllib, which recurses per level ---

def test_a_deeply_nested_config_is_one_config_error(tmp_path):
    deep = tmp_path / "deep.toml"
    deep.write_text("[agent]\nx = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError, match=r"deep\.toml: not valid TOML: nested too deeply \(100000 levels") as exc:
        load_toml(deep)
    assert exc.value.exit_code == 2 and "\n" not in str(exc.value)
    inline = tmp_path / "inline.toml"
    inline.write_text("x = " + "{a = " * 50_000 + "1" + "}" * 50_000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_toml(inline)


def test_a_config_larger_than_the_bound_is_refused(tmp_path):
    big = tmp_path / "big.toml"
    big.write_bytes(b"# " + b"x" * MAX_FILE_BYTES + b"\n")
    with pytest.raises(ConfigError, match="larger than"):
        load_toml(big)


@pytest.mark.parametrize("text", [
    'a = "[[[[" # ]]]]\nb = 1',
    "a = '[[[['\nb = '''\n{{{{\n'''",
    'a = """x""""\nb = [1]',  # a multi-line string ends at the last three of its quotes
    'a = "\\"[[[["\nb = [[1]]',
    '["t.[x]"]\nc = [ # [[[\n  1, 2 ]\n',
    '[[points]]\nx = 1\n[[points]]\nx = 2',
])
def test_strings_and_comments_do_not_nest(text):
    assert parse_toml(text.encode(), "f") == tomllib.loads(text)


_PIECES = st.text(alphabet=st.sampled_from("[]{}\"'#\\ a"), max_size=6)


def _string(text: str, style: int) -> str:
    basic = json.dumps(text)  # JSON's escapes are TOML's
    if style == 1 and "'" not in text:
        return f"'{text}'"
    if style == 2 and "'''" not in text and not text.endswith("'"):
        return f"'''{text}'''"
    if style == 3:
        return f'"""{basic[1:-1]}"""'
    return basic


@settings(max_examples=200, deadline=None)
@given(depth=st.integers(1, MAX_DEPTH + 3), strings=st.lists(st.tuples(_PIECES, st.integers(0, 3)), max_size=4),
       comment=_PIECES)
def test_toml_nesting_is_counted_outside_strings_and_comments(depth, strings, comment):
    items = ", ".join(_string(t, style) for t, style in strings)
    text = f"# {comment}\nk = " + "[" * depth + items + "]" * depth + f" # {comment}\n"
    if depth <= MAX_DEPTH:
        assert parse_toml(text.encode(), "f") == tomllib.loads(text)
    else:
        with pytest.raises(ConfigError, match="nested too deeply"):
            parse_toml(text.encode(), "f")
