"""The Consul client's pure parts: settings, token handling, blocking-query rules."""

import random

import pytest

from azprobe.config import Section
from azprobe.clients.consul import (ConsulSettings, TxnConflict, backoff_delay, make_client, next_index,
                            normalize_address, op_check_session, op_set, rate_limit_delay)
from azprobe.errors import ConfigError
from tests.helpers import write_secret


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("CONSUL_HTTP_ADDR", "CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE", "CONSUL_CACERT"):
        monkeypatch.delenv(name, raising=False)


def test_next_index_follows_consuls_rules():
    assert next_index(0, 5) == 5           # first read
    assert next_index(5, 9) == 9           # normal progress
    assert next_index(9, 9) == 9           # timeout, no change
    assert next_index(9, 4) == 0           # went backwards: reset, fresh read
    assert next_index(0, 0) == 1           # a 0 would make every call return at once
    assert next_index(5, 0) == 0           # 0 after 5 is also "backwards"
    assert next_index(0, -3) == 0          # and negative is treated the same way


def test_backoff_grows_is_capped_and_jittered():
    rng = random.Random(1)
    delays = [backoff_delay(a, base_s=0.2, cap_s=5.0, rng=rng) for a in range(12)]
    for attempt, delay in enumerate(delays):
        ceiling = min(5.0, 0.2 * 2**attempt)
        assert ceiling / 2 <= delay <= ceiling
    assert max(delays) <= 5.0
    assert len({round(backoff_delay(3, 0.2, 5.0, rng), 6) for _ in range(20)}) > 1  # jitter
    assert backoff_delay(10**6, 0.2, 5.0, rng) <= 5.0  # no overflow on long outages


def test_rate_limit_spaces_calls():
    assert rate_limit_delay(None, 100.0, 0.1) == 0.0
    assert rate_limit_delay(100.0, 100.03, 0.1) == pytest.approx(0.07)
    assert rate_limit_delay(100.0, 100.5, 0.1) == 0.0


def test_address_normalisation():
    assert normalize_address("127.0.0.1:8500") == "http://127.0.0.1:8500"
    assert normalize_address("https://consul.example") == "https://consul.example:443"
    assert normalize_address("http://[::1]:8501") == "http://[::1]:8501"
    with pytest.raises(ConfigError, match="scheme must be http or https"):
        normalize_address("unix:///tmp/consul.sock")
    with pytest.raises(ConfigError, match="bad port"):
        normalize_address("http://127.0.0.1:notaport")


def test_env_defaults_and_flag_precedence(monkeypatch):
    assert ConsulSettings.from_env().address == "http://127.0.0.1:8500"
    monkeypatch.setenv("CONSUL_HTTP_ADDR", "198.18.0.1:8500")
    assert ConsulSettings.from_env().address == "http://198.18.0.1:8500"
    assert ConsulSettings.from_env(address="http://127.0.0.1:9999").address == "http://127.0.0.1:9999"
    assert ConsulSettings.from_env(prefix="x/y").prefix == "x/y/"
    assert ConsulSettings.from_env().key("weights") == "azprobe/v1/weights"


def test_token_sources_and_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", "env-token")
    assert ConsulSettings.from_env().current_token() == "env-token"
    token_file = write_secret(tmp_path / "token", "file-token\n")
    monkeypatch.setenv("CONSUL_HTTP_TOKEN_FILE", str(token_file))
    assert ConsulSettings.from_env().current_token() == "file-token"  # a file beats a token, as in Consul
    explicit = write_secret(tmp_path / "explicit", "explicit-token")
    section = Section({"token_file": str(explicit)}, "consul")
    assert ConsulSettings.from_section(section).current_token() == "explicit-token"
    with pytest.raises(ConfigError, match=r"consul\.token_file: cannot read .*missing"):
        ConsulSettings.from_section(Section({"token_file": str(tmp_path / "missing")}, "consul"))
    (tmp_path / "explicit").chmod(0o640)
    with pytest.raises(ConfigError, match=r"^consul\.token_file: .*explicit has mode 0640: .*\(chmod 600 "):
        ConsulSettings.from_section(section)
    token_file.chmod(0o644)
    with pytest.raises(ConfigError, match=r"^CONSUL_HTTP_TOKEN_FILE: .*token has mode 0644: .*\(chmod 600 "):
        ConsulSettings.from_env()
    write_secret(tmp_path / "empty", "  \n")
    with pytest.raises(ConfigError, match="CONSUL_HTTP_TOKEN_FILE: .*empty must hold one token"):
        monkeypatch.setenv("CONSUL_HTTP_TOKEN_FILE", str(tmp_path / "empty"))
        ConsulSettings.from_env()


def test_token_is_never_in_repr_or_str(monkeypatch):
    settings = ConsulSettings(address="http://127.0.0.1:8500", token="s3cr3t-token")
    assert "s3cr3t" not in repr(settings) and "s3cr3t" not in str(settings)
    assert "token=<set>" in repr(settings)


def test_explicit_token_beats_py_consul_env_override(monkeypatch):
    # py-consul lets CONSUL_HTTP_TOKEN override the token passed to it; our settings decide.
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", "from-env")
    client = make_client(ConsulSettings(token="from-settings"))
    assert client.prepare_headers() == {"X-Consul-Token": "from-settings"}


def test_from_section_reads_the_consul_table(monkeypatch):
    section = Section({"address": "http://127.0.0.1:8600", "prefix": "team/azprobe/", "ca_file": "/etc/ca.pem"}, "consul")
    settings = ConsulSettings.from_section(section)
    assert (settings.address, settings.prefix, settings.ca_file, settings.token) == \
        ("http://127.0.0.1:8600", "team/azprobe/", "/etc/ca.pem", None)
    monkeypatch.setenv("CONSUL_HTTP_ADDR", "127.0.0.1:8700")
    monkeypatch.setenv("CONSUL_CACERT", "/env/ca.pem")
    settings = ConsulSettings.from_section(Section({}, "consul"))
    assert settings.address == "http://127.0.0.1:8700" and settings.ca_file == "/env/ca.pem"
    with pytest.raises(ConfigError, match=r"consul\.adress: unknown key"):
        ConsulSettings.from_section(Section({"adress": "x"}, "consul"))
    with pytest.raises(ConfigError, match=r"consul\.address: .*scheme"):
        ConsulSettings.from_section(Section({"address": "ftp://x:1"}, "consul"))


def test_txn_op_builders_encode_values():
    assert op_set("k", b"\x00\xff") == {"KV": {"Verb": "set", "Key": "k", "Value": "AP8="}}
    assert op_check_session("azprobe/v1/leader", "sid") == \
        {"KV": {"Verb": "check-session", "Key": "azprobe/v1/leader", "Session": "sid"}}
    conflict = TxnConflict([{"OpIndex": 0, "What": "failed session check"}])
    assert "op 0: failed session check" in str(conflict) and conflict.errors[0]["OpIndex"] == 0
