"""The Prometheus source over https (a real aiohttp server with a context from the one
builder, certificates from tests/pki.py): verified against prometheus.ca_file, with a
bearer token file or a basic-auth file, and a rotated token file sent from the next
query on, without a restart."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from pathlib import Path

import pytest
from aiohttp import web

from azprobe.controller.config import parse_config
from azprobe.controller.prom_source import PrometheusCollector
from azprobe.errors import ConfigError
from azprobe.security.tls import TlsFiles, server_context
from tests.controller_harness import topology
from tests.pki import TestCA
from tests.unit.test_prom_source import scraped_agent

_, ANSWER = scraped_agent(ticks=3)
BODY = json.dumps(ANSWER).encode()


def _secret(path: Path, text: str) -> str:
    staged = path.with_suffix(".new")
    staged.write_text(text)
    staged.chmod(0o600)
    os.replace(staged, path)  # a new inode, as a rotation by rename makes
    return str(path)


def _collector(url: str, **prometheus: str) -> PrometheusCollector:
    config = parse_config({"controller": {"name": "c"}, "consul": {}, "agents": {"source": "prometheus"},
                           "prometheus": {"url": url, "query_timeout_s": 2.0, **prometheus},
                           "topology": {"azs": ["az-a", "az-b", "az-c"]}})
    return PrometheusCollector(config.prometheus, evaluation_window_s=1e9, stale_after_s=5.0, topology=topology())


@pytest.fixture
def pki(tmp_path):
    ca = TestCA.create(tmp_path / "ca", "prom-ca")
    return ca, ca.issue("prometheus", dns=["localhost"], ips=["127.0.0.1"])


def _serve_and_pull(pki, want: list[str], collector_for, rounds: int = 1, between=None) -> tuple[list, list]:
    """An https query API that answers 200 only to an Authorization header in `want`
    (401 otherwise); `rounds` cycles of the collector; (results, headers seen)."""
    _, leaf = pki
    seen: list[str] = []

    async def query(request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        seen.append(auth)
        if auth not in want:
            return web.Response(status=401, text="unauthorized")
        return web.Response(body=BODY, content_type="application/json")

    async def run() -> list:
        app = web.Application()
        app.router.add_get("/api/v1/query", query)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0,
                           ssl_context=server_context(TlsFiles(leaf.cert_file, leaf.key_file), "test prometheus"))
        await site.start()
        collector = collector_for(f"https://127.0.0.1:{site._server.sockets[0].getsockname()[1]}")
        results = []
        try:
            for i in range(rounds):
                if between is not None and i:
                    between(i)
                results.append(await collector.pull_all())
        finally:
            await collector.close()
            await runner.cleanup()
        return results

    return asyncio.run(run()), seen


def test_https_with_the_ca_and_a_bearer_token_file(pki, tmp_path):
    ca, _ = pki
    token = _secret(tmp_path / "token", "t0ken-1\n")
    results, seen = _serve_and_pull(pki, ["Bearer t0ken-1"],
                                    lambda url: _collector(url, ca_file=ca.cert_file, bearer_token_file=token))
    assert results[0].ingested == 3 and seen == ["Bearer t0ken-1"]


def test_basic_auth_from_a_file(pki, tmp_path):
    ca, _ = pki
    basic = _secret(tmp_path / "basic", "scraper:pa:ss word\n")
    want = "Basic " + base64.b64encode(b"scraper:pa:ss word").decode()
    results, _ = _serve_and_pull(pki, [want], lambda url: _collector(url, ca_file=ca.cert_file, basic_auth_file=basic))
    assert results[0].ingested == 3


def test_a_rotated_token_file_is_sent_from_the_next_query_on(pki, tmp_path):
    ca, _ = pki
    token = tmp_path / "token"
    _secret(token, "old-token\n")
    results, seen = _serve_and_pull(pki, ["Bearer old-token", "Bearer new-token"],
                                    lambda url: _collector(url, ca_file=ca.cert_file, bearer_token_file=str(token)),
                                    rounds=2, between=lambda _: _secret(token, "new-token\n"))
    assert seen == ["Bearer old-token", "Bearer new-token"]
    assert results[0].failed == 0 and results[1].failed == 0


def test_without_the_ca_the_query_fails_naming_the_fix(pki, caplog):
    caplog.set_level("INFO", logger="azprobe.controller.prom_source")
    results, seen = _serve_and_pull(pki, [""], lambda url: _collector(url))
    assert seen == [] and results[0].ingested == 0 and results[0].failed == 1
    (line,) = [r.getMessage() for r in caplog.records if "prometheus query failing" in r.getMessage()]
    assert "not signed by a CA we trust (set prometheus.ca_file" in line, line


def test_a_token_file_others_may_read_is_refused_at_start(tmp_path):
    token = tmp_path / "token"
    token.write_text("t\n")
    token.chmod(0o644)
    with pytest.raises(ConfigError, match="prometheus.bearer_token_file.*chmod 600"):
        _collector("https://127.0.0.1:9", bearer_token_file=str(token))
    with pytest.raises(ConfigError, match="prometheus.ca_file: is set but prometheus.url is not https"):
        _collector("http://127.0.0.1:9", ca_file=str(token))
