import json
import os
import stat
import struct
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from azprobe.config import (MAX_FILE_BYTES, MAX_SECRET_BYTES, Section, load_toml, parse_host_port, parse_toml,
                            parse_topology, read_file, read_secret_file, read_token_file)
from azprobe.contracts.bounded_json import MAX_DEPTH
from azprobe.errors import ConfigError
from tests.helpers import require, require_root


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


@pytest.mark.parametrize("az, problem", [("zone-é", "contains 'é'"), ("ＡＺ１", "contains"), ("a" * 64, "has 64 characters"),
                                         ("other", "is reserved"), ("a b", "contains ' '")])
def test_the_agents_topology_takes_only_names_the_windows_may_carry(az, problem):
    # isalnum() took Unicode letters and any length: the config loaded, and the controller
    # then refused every window with a path to that AZ
    with pytest.raises(ConfigError) as exc:
        parse_topology(Section({"az-a": ["198.18.1.0/24"], az: ["198.18.2.0/24"]}, "topology"))
    assert exc.value.exit_code == 2 and f"AZ name {problem}" in str(exc.value) and "\n" not in str(exc.value)
    assert parse_topology(Section({"az.a_1-x": ["198.18.1.0/24"]}, "topology"))  # the windows' rule allows '.'


@pytest.mark.parametrize("value", [10**400, -(10**400), float("nan")], ids=["huge", "-huge", "nan"])
def test_a_number_past_a_floats_range_is_a_config_error_not_a_traceback(value):
    with pytest.raises(ConfigError, match=r"^controller\.interval_s: ") as exc:
        Section({"interval_s": value}, "controller").number("interval_s", 1.0, min=0.1, max=3600)
    assert exc.value.exit_code == 2 and len(str(exc.value)) < 200


def test_host_port():
    assert parse_host_port("127.0.0.1:9740", "x") == ("127.0.0.1", 9740)
    assert parse_host_port("[::1]:80", "x") == ("::1", 80)
    for bad in ("nope", "127.0.0.1:\u00b2", "127.0.0.1:" + "9" * 5000):  # "²" passes isdigit(), not int()
        with pytest.raises(ConfigError, match="is not host:port"):
            parse_host_port(bad, "agent.listen")


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
# --- secret files (tokens, keys) --------------------------------------------------------

def _acl(*entries: tuple[int, int, int]) -> bytes:
    """A Linux POSIX ACL xattr value: version 2, then (tag, permissions, id) entries."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def _credential_acl(reader_uid: int) -> bytes:
    """What systemd's LoadCredential= leaves: owner r, user:<service uid>:r, no group, no other."""
    undefined = 0xFFFFFFFF
    return _acl((0x01, 4, undefined), (0x02, 4, reader_uid), (0x04, 0, undefined), (0x10, 4, undefined),
                (0x20, 0, undefined))


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o700])
def test_a_token_file_of_the_owner_only_is_read(tmp_path, mode):
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    path.chmod(mode)
    assert read_token_file(path, "agents.token_file") == "s3cret"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o602, 0o620, 0o610])
def test_a_token_file_others_may_read_or_write_is_refused_naming_mode_and_fix(tmp_path, mode):
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    path.chmod(mode)
    with pytest.raises(ConfigError) as exc:
        read_token_file(path, "agents.token_file")
    assert str(exc.value) == (f"agents.token_file: {path} has mode {mode:04o}: other users may read or write it "
                              f"(chmod 600 {path})")
    assert exc.value.exit_code == 2


def test_a_root_owned_secret_its_group_may_read_is_read_by_a_non_root_member(tmp_path, monkeypatch):
    """Kubernetes mounts a Secret for a non-root pod as root:<fsGroup> 0440; PostgreSQL
    accepts a root-owned key file its own group may read. Group write is still refused,
    and so is a group the reader is not in."""
    require_root("chown")
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    os.chown(path, 0, os.getegid())
    path.chmod(0o440)
    monkeypatch.setattr(os, "geteuid", lambda: 65532)  # the pod's runAsUser; its group is the file's
    assert read_token_file(path, "agents.token_file") == "s3cret"
    path.chmod(0o460)
    with pytest.raises(ConfigError, match="has mode 0460: other users may read or write it"):
        read_token_file(path, "agents.token_file")
    path.chmod(0o440)
    os.chown(path, 0, 65534)  # a group the reader is not in
    with pytest.raises(ConfigError, match="has mode 0440: other users may read or write it"):
        read_token_file(path, "agents.token_file")


def test_a_secret_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)  # opened blocking, this would wait for a writer for ever
    for path in (fifo, tmp_path):
        with pytest.raises(ConfigError, match=f"^consul.token_file: {path} is not a regular file"):
            read_secret_file(path, "consul.token_file")


def test_an_operators_file_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path):
    # a plain open() of a FIFO waits for a writer: `xds serve` with such an endpoints_file,
    # or a config path that became one before a SIGHUP, hung for ever
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(ConfigError, match=f"^xds.endpoints_file: {fifo} is not a regular file"):
        read_file(fifo, "xds.endpoints_file")
    with pytest.raises(ConfigError, match=f"^{fifo}: config is not a regular file"):
        load_toml(fifo)
    for read in (lambda p: read_file(p, "xds.endpoints_file"), load_toml,
                 lambda p: read_secret_file(p, "consul.token_file")):
        with pytest.raises(ConfigError, match="contains a NUL byte"):
            read(f"{tmp_path}/a\0b")


def test_a_secret_owned_by_another_user_is_refused(tmp_path):
    require_root("chown")
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    path.chmod(0o600)
    os.chown(path, 65534, 65534)
    with pytest.raises(ConfigError) as exc:
        read_secret_file(path, "agent.token_file")
    assert str(exc.value) == (f"agent.token_file: {path} is owned by uid 65534, not by this user (uid 0) or root "
                              f"(chown root {path})")


def test_a_systemd_credential_is_read_by_its_service_user_only(tmp_path, monkeypatch):
    """Root-owned 0400 plus an ACL entry for the service's uid: stat shows 0440 (the group
    bits are the ACL mask), yet only that uid may read it."""
    path = tmp_path / "agent-token"
    path.write_text("s3cret\n")
    path.chmod(0o400)
    try:
        os.setxattr(path, "system.posix_acl_access", _credential_acl(61234))
    except OSError as exc:
        require(False, f"POSIX ACLs on {tmp_path} ({exc.strerror})", "run the tests on ext4, xfs or tmpfs")
    assert stat.S_IMODE(path.stat().st_mode) == 0o440
    monkeypatch.setattr(os, "geteuid", lambda: 61234)  # the service's dynamic user
    if path.stat().st_uid == 0:
        assert read_token_file(path, "agents.token_file") == "s3cret"
    monkeypatch.setattr(os, "geteuid", lambda: path.stat().st_uid)  # anyone else: the ACL lets 61234 read
    with pytest.raises(ConfigError) as exc:
        read_token_file(path, "agents.token_file")
    assert f"{path} has mode 0440 and an ACL: other users may read" in str(exc.value)
    assert f"(setfacl -b {path} && chmod 600 {path})" in str(exc.value)


def test_a_group_acl_entry_is_refused(tmp_path):
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    path.chmod(0o600)
    undefined = 0xFFFFFFFF
    try:
        os.setxattr(path, "system.posix_acl_access",
                    _acl((0x01, 6, undefined), (0x04, 0, undefined), (0x08, 4, 4321), (0x10, 4, undefined),
                         (0x20, 0, undefined)))
    except OSError as exc:
        require(False, f"POSIX ACLs on {tmp_path} ({exc.strerror})", "run the tests on ext4, xfs or tmpfs")
    with pytest.raises(ConfigError, match="and an ACL: other users may read or write it"):
        read_token_file(path, "agents.token_file")


def test_an_oversized_secret_is_refused(tmp_path):
    path = tmp_path / "token"
    path.write_bytes(b"x" * (MAX_SECRET_BYTES + 1))
    path.chmod(0o600)
    with pytest.raises(ConfigError, match=f"is over {MAX_SECRET_BYTES} bytes"):
        read_secret_file(path, "agents.token_file")
