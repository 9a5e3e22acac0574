"""Consul's TLS settings take Consul's CLI precedence: an explicit value (a flag, or the
config file's [consul] key) beats the environment variable, which beats the default;
CONSUL_HTTP_SSL_VERIFY and CONSUL_HTTP_SSL are Go's ParseBool; TLS files are checked at
start (a key others may read exits 2). Certificates from tests/pki.py."""

from __future__ import annotations

import pytest

from azprobe.clients.consul import ConsulSettings
from azprobe.config import Section
from azprobe.errors import EXIT_USAGE, ConfigError
from tests.pki import TestCA

ENV = ("CONSUL_HTTP_ADDR", "CONSUL_CACERT", "CONSUL_CLIENT_CERT", "CONSUL_CLIENT_KEY", "CONSUL_TLS_SERVER_NAME",
       "CONSUL_HTTP_SSL_VERIFY", "CONSUL_HTTP_SSL", "CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE")


@pytest.fixture
def env(monkeypatch, tmp_path):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    ca = TestCA.create(tmp_path / "ca", "ca")
    return monkeypatch, ca, ca.issue("env-client"), ca.issue("flag-client")


def test_the_environment_beats_the_default(env):
    monkeypatch, ca, client, _ = env
    monkeypatch.setenv("CONSUL_HTTP_ADDR", "https://127.0.0.1:8501")
    monkeypatch.setenv("CONSUL_CACERT", ca.cert_file)
    monkeypatch.setenv("CONSUL_CLIENT_CERT", client.cert_file)
    monkeypatch.setenv("CONSUL_CLIENT_KEY", client.key_file)
    monkeypatch.setenv("CONSUL_TLS_SERVER_NAME", "server.dc1.consul")
    s = ConsulSettings.from_env()
    assert (s.address, s.ca_file, s.cert_file, s.key_file, s.server_name, s.verify) == (
        "https://127.0.0.1:8501", ca.cert_file, client.cert_file, client.key_file, "server.dc1.consul", True)
    assert ConsulSettings.from_env(address=None).tls


def test_a_flag_beats_the_environment(env):
    monkeypatch, ca, client, flag = env
    monkeypatch.setenv("CONSUL_HTTP_ADDR", "https://127.0.0.1:8501")
    monkeypatch.setenv("CONSUL_CLIENT_CERT", client.cert_file)
    monkeypatch.setenv("CONSUL_CLIENT_KEY", client.key_file)
    monkeypatch.setenv("CONSUL_TLS_SERVER_NAME", "env.consul")
    s = ConsulSettings.from_env(address="https://127.0.0.2:8501", ca_file=ca.cert_file, cert_file=flag.cert_file,
                                key_file=flag.key_file, server_name="flag.consul")
    assert (s.address, s.cert_file, s.key_file, s.server_name) == (
        "https://127.0.0.2:8501", flag.cert_file, flag.key_file, "flag.consul")


def test_the_config_file_counts_as_explicit(env):
    monkeypatch, ca, client, flag = env
    monkeypatch.setenv("CONSUL_HTTP_ADDR", "https://127.0.0.1:8501")
    monkeypatch.setenv("CONSUL_CLIENT_CERT", client.cert_file)
    monkeypatch.setenv("CONSUL_CLIENT_KEY", client.key_file)
    monkeypatch.setenv("CONSUL_HTTP_SSL_VERIFY", "false")
    s = ConsulSettings.from_section(Section({"cert_file": flag.cert_file, "key_file": flag.key_file,
                                             "ca_file": ca.cert_file, "verify": True}, "consul"))
    assert (s.address, s.cert_file, s.key_file, s.verify) == ("https://127.0.0.1:8501", flag.cert_file,
                                                              flag.key_file, True)
    unset = ConsulSettings.from_section(Section({}, "consul"))
    assert (unset.cert_file, unset.verify) == (client.cert_file, False)


@pytest.mark.parametrize("value,verify", [(v, True) for v in ("1", "t", "T", "TRUE", "true", "True")]
                         + [(v, False) for v in ("0", "f", "F", "FALSE", "false", "False")])
def test_ssl_verify_is_go_parsebool(env, value, verify):
    monkeypatch, *_ = env
    monkeypatch.setenv("CONSUL_HTTP_SSL_VERIFY", value)
    assert ConsulSettings.from_env(address="https://127.0.0.1:8501").verify is verify


@pytest.mark.parametrize("name", ["CONSUL_HTTP_SSL_VERIFY", "CONSUL_HTTP_SSL"])
def test_a_bad_boolean_is_a_config_error_naming_the_variable(env, name):
    monkeypatch, *_ = env
    monkeypatch.setenv(name, "yes")
    with pytest.raises(ConfigError, match=f"^{name}: 'yes' is not a boolean") as err:
        ConsulSettings.from_env()
    assert err.value.exit_code == EXIT_USAGE


def test_consul_http_ssl_selects_https(env):
    monkeypatch, *_ = env
    monkeypatch.setenv("CONSUL_HTTP_SSL", "true")
    monkeypatch.setenv("CONSUL_HTTP_ADDR", "127.0.0.1:8501")
    assert ConsulSettings.from_env().address == "https://127.0.0.1:8501"


def test_a_client_key_others_may_read_is_refused_at_start(env, tmp_path):
    monkeypatch, ca, client, _ = env
    (tmp_path / "loose.key").write_bytes(open(client.key_file, "rb").read())
    (tmp_path / "loose.key").chmod(0o644)
    with pytest.raises(ConfigError, match=r"consul\.key_file: .*mode 0644.*chmod 600") as err:
        ConsulSettings.from_env(address="https://127.0.0.1:8501", ca_file=ca.cert_file,
                                cert_file=client.cert_file, key_file=str(tmp_path / "loose.key"))
    assert "PRIVATE KEY" not in str(err.value)
    with pytest.raises(ConfigError, match="needs both cert_file and key_file"):
        ConsulSettings.from_env(address="https://127.0.0.1:8501", cert_file=client.cert_file)


def test_tls_files_are_not_read_for_plain_http(env):
    monkeypatch, *_ = env
    monkeypatch.setenv("CONSUL_CACERT", "/nonexistent/ca.pem")  # a shell's leftover, unused over http
    assert ConsulSettings.from_env(address="http://127.0.0.1:8500").ca_file == "/nonexistent/ca.pem"


def test_the_token_stays_out_of_the_repr(env):
    s = ConsulSettings(address="https://127.0.0.1:8501", token="s3cret", cert_file="/c", key_file="/k")
    assert "s3cret" not in repr(s) and "cert_file='/c'" in repr(s)
