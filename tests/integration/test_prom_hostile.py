"""The Prometheus source against a hostile Prometheus over real sockets (tests.hostileprom):
an answer over max_response_bytes or max_series is refused while it streams in, not
after reading it; and a real controller reading a series bomb (400 series, ~21 MB per
answer, every window's t0 missing from the counters) keeps its event loop, its Consul
session and its weights writes going."""

from __future__ import annotations

import asyncio
import time

import pytest

from azprobe.clients.consul import ConsulSettings, make_client
from azprobe.controller.config import parse_config
from azprobe.controller.prom_source import PrometheusCollector
from azprobe.controller.topology import Topology
from tests.controller_harness import ControllerProcess, controller_config, leader_holder, read_weights
from tests.helpers import wait_for
from tests.hostileprom import AZS, HostilePrometheus

FLOOD_BYTES = 100 << 20


def _refusal(url: str, **bounds: int) -> tuple[PrometheusCollector, str]:
    """One pull against `url`; the collector and the error it recorded."""
    config = parse_config({"controller": {"name": "c"}, "consul": {}, "agents": {"source": "prometheus"},
                           "prometheus": {"url": url, "query_timeout_s": 30.0, **bounds},
                           "topology": {"azs": list(AZS)}})
    collector = PrometheusCollector(config.prometheus, evaluation_window_s=5.0, stale_after_s=5.0,
                                    topology=Topology(config.topology))

    async def pull() -> None:
        try:
            await collector.pull_all()
        finally:
            await collector.close()

    asyncio.run(pull())
    return collector, collector._last_error


def test_an_answer_over_the_bounds_is_refused_while_it_streams_in():
    with HostilePrometheus(flood_bytes=FLOOD_BYTES) as prom:
        # 100 MB, no Content-Length: refused at the byte bound, the rest never read.
        collector, error = _refusal(prom.url("flood"), max_response_bytes=4 << 20)
        assert "max_response_bytes" in error and collector.counters.pull_errors == 1
        # Under the byte bound but over max_series: refused at the series past the bound,
        # as it is decoded, not after the whole answer was read.
        collector, error = _refusal(prom.url("flood"), max_response_bytes=40 << 20, max_series=2000)
        assert "max_series" in error and collector.counters.pull_errors == 1
        sent = wait_for(lambda: len(prom.bytes_sent("flood")) == 2 and prom.bytes_sent("flood"),
                        message="both answers ended")
    # What the server got written before the client closed: what was read (the bound, or
    # ~160 kB of series), a piece, and the socket buffers (~5 MB here, autotuned up to
    # tcp_rmem's 32 MB); never most of the answer.
    assert sent[0] < FLOOD_BYTES // 2 and sent[1] < FLOOD_BYTES // 2, sent


@pytest.mark.slow
def test_a_series_bomb_does_not_stall_the_leader(tmp_path, devconsul):
    with HostilePrometheus() as prom:
        config = controller_config("ctl", devconsul.url, [], interval_s=1.0, evaluation_window_s=5.0)
        config["agents"] = {"source": "prometheus"}
        # Time enough to read each bomb whole: its windows are ingested, not refused.
        config["prometheus"] = {"url": prom.url("live"), "query_timeout_s": 10.0}
        config["topology"] = {"azs": list(AZS)}
        config["safety"].update(heartbeat_s=1.0, stale_after_s=20, equal_after_s=40)
        client = make_client(ConsulSettings(address=devconsul.url))
        with ControllerProcess(tmp_path, config) as ctl:
            first = wait_for(lambda: read_weights(client), timeout=60, message="a first weights document")
            holder = leader_holder(client)
            assert holder is not None and holder["name"] == "ctl"
            prom.live = "bomb"
            # While the next bomb answers are read, decoded and turned into windows, the
            # event loop answers /healthz, and the Consul loop renews the session and
            # writes the heartbeat (every 1 s) - each checked with a generous deadline.
            writes = [first.generation]
            deadline = time.monotonic() + 120
            while len(prom.bytes_sent("bomb")) < 5:
                assert time.monotonic() < deadline, "the controller stopped querying"
                health = wait_for(ctl.healthz, timeout=5, message="/healthz while a bomb is decoded")
                assert health["leader"], health
                doc = wait_for(lambda: (d := read_weights(client)) and d.generation > writes[-1] and d,
                               timeout=10, message="the next heartbeat write while a bomb is decoded")
                writes.append(doc.generation)
            assert leader_holder(client)["session"] == holder["session"]  # never lost, never re-acquired
            assert ctl.log().count(" starts above generation") == 1, ctl.log()
            # The bombs were read whole and their windows ingested (nothing refused).
            wait_for(lambda: ctl.metric("azprobe_controller_collect_windows_ingested_total") > 400, timeout=30,
                     message="the bombs' windows ingested")
            assert ctl.metric("azprobe_controller_collect_pull_timeouts_total") == 0
            assert ctl.metric("azprobe_controller_collect_pull_errors_total") == 0
