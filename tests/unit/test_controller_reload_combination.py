"""SIGHUP never installs a config that start refuses: the fields kept until a restart meet
the new file's fields in the merged config, which must pass start's checks across fields
(config.check_combination), or the reload is refused whole; and a RESTART field that
changed keeps the fields that go with it (agents.source: the running static list)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from azprobe.controller.config import load_config
from azprobe.controller.main import Controller
from azprobe.errors import ConfigError
from tests.helpers import refused_port

AZS = ["az-a", "az-b", "az-c"]


def _toml(controller: dict[str, Any], agents: dict[str, Any], extra: str = "") -> str:
    def table(values: dict[str, Any]) -> str:
        return "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in values.items())
    return (f'[controller]\nname = "c"\nlisten = "127.0.0.1:0"\n{table(controller)}'
            f'[consul]\naddress = "http://127.0.0.1:1"\n[agents]\n{table(agents)}'
            f'[topology]\nazs = {AZS!r}\n'.replace("'", '"') + extra)


def _reload(ctl: Controller, file: Path, text: str, caplog) -> list[logging.LogRecord]:
    file.write_text(text)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="azprobe.controller"):
        ctl.reload(str(file))
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_switching_the_source_to_prometheus_keeps_pulling_the_running_agents(tmp_path, caplog):
    file = tmp_path / "controller.toml"
    with refused_port() as a, refused_port() as b, refused_port() as c:
        urls = [f"http://127.0.0.1:{port}" for port in (a, b, c)]
        file.write_text(_toml({"evaluation_window_s": 10.0}, {"static": urls}))
        ctl = Controller(load_config(file))
        logged = _reload(ctl, file, _toml({"evaluation_window_s": 10.0}, {"source": "prometheus"},
                                          '[prometheus]\nurl = "http://127.0.0.1:9090"\n[model]\nname = "seed-v1"\n'),
                         caplog)
        assert len(logged) == 1 and logged[0].levelno == logging.WARNING, [r.getMessage() for r in logged]
        assert "agents.source" in logged[0].getMessage() and "agents.static" in logged[0].getMessage()
        assert ctl.config.agents.source == "direct" and ctl.config.agents.static == tuple(urls)
        assert ctl.config.prometheus is None and ctl.decider.rules.model.name == "seed-v1"  # the rest applies

        async def one_cycle() -> None:
            await ctl.decider.cycle()
            await ctl.collector.close()

        asyncio.run(one_cycle())
        assert sorted(t.url for t in (cursor.target for cursor in ctl.collector.cursors.values())) == sorted(urls)


@pytest.mark.parametrize("running, edited, merged, field", [
    # evaluation_window_s needs a restart: the running 10 s stays, against the new 1 s forget time
    (({"evaluation_window_s": 10.0}, {"static": ["http://198.18.1.2:9740"]}),
     ({"evaluation_window_s": 1.0}, {"static": ["http://198.18.1.2:9740"], "forget_after_s": 1.0}),
     ({"evaluation_window_s": 10.0}, {"static": ["http://198.18.1.2:9740"], "forget_after_s": 1.0}),
     "agents.forget_after_s"),
    # discover needs a restart: the running direct pull would be left with no agents
    (({}, {"static": ["http://198.18.1.2:9740"]}), ({}, {"discover": "consul"}), ({}, {}), "agents.static"),
])
def test_a_reload_whose_merged_config_start_refuses_is_refused_whole(tmp_path, caplog, running, edited, merged,
                                                                    field):
    file = tmp_path / "controller.toml"
    file.write_text(_toml(*running))
    ctl = Controller(load_config(file))
    old, forget = ctl.config, ctl.collector.identities.forget_after_s
    logged = _reload(ctl, file, _toml(*edited, '[model]\nname = "seed-v1"\n'), caplog)
    assert len(logged) == 1 and logged[0].levelno == logging.ERROR, [r.getMessage() for r in logged]
    message = logged[0].getMessage()
    assert message.startswith(f"reload failed, keeping the running config: {field}: ") and "restart" in message
    assert ctl.config is old and ctl.collector.identities.forget_after_s == forget
    assert ctl.decider.rules.model.name == "default"  # nothing of the file applies
    # the file alone starts; the combination the reload would have run does not, for the same field
    load_config(file)
    file.write_text(_toml(*merged))
    with pytest.raises(ConfigError) as refused:
        load_config(file)
    assert refused.value.field == field
