"""Consul goes away and comes back (devconsul SIGKILLed, restarted on the same port and
data dir): the controller keeps running and pulling, logs each state change once, and
resumes writing when Consul returns.

The outage outlasts every timer the controller and Consul run on it: 2 x the session TTL
(when Consul would have expired the session; a restarted Consul restarts every session's
TTL) and the write backoff's cap. The controller cannot renew its session all that time,
steps down, and must come back as leader when Consul returns.
"""

from __future__ import annotations

import time

import consul
import pytest

from azprobe.controller.consul_duties import WRITE_BACKOFF_MAX_S
from tests.controller_harness import SESSION_TTL_S, ControllerProcess, read_weights
from tests.fakeagent import FakeAgentServer, zone_agents
from tests.helpers import wait_for

OUTAGE_S = 2 * SESSION_TTL_S + WRITE_BACKOFF_MAX_S


@pytest.mark.slow
def test_consul_outage_keeps_running_and_resumes(devconsul, tmp_path):
    client = consul.Consul(host=devconsul.host, port=devconsul.port)
    server = FakeAgentServer(interval_s=0.2)
    for key, agent in zone_agents(["az-a", "az-b"], 2).items():
        server.add(key, agent)
    with server, ControllerProcess.make(tmp_path, "ctl-1", devconsul.url,
                                        [server.url(k) for k in server.agents]) as ctl:
        before = wait_for(lambda: read_weights(client), timeout=20, message="first write")
        assert devconsul.data_dir is not None

        devconsul.kill()
        outage_started = time.monotonic()
        wait_for(lambda: (h := ctl.healthz()) is not None and h["consul_up"] is False, timeout=10,
                 message="controller notices Consul is gone")
        cycles = ctl.metric("azprobe_controller_cycle_seconds_count")
        # Throughout the outage the daemon stays up, answers, and keeps cycling (pulling).
        while time.monotonic() - outage_started < OUTAGE_S:
            health = ctl.healthz()
            assert ctl.running and health is not None and health["consul_up"] is False
            assert health["leader"] is False  # cannot prove it holds the lock: stepped down
            time.sleep(0.2)  # pacing the observation loop, not synchronising
        # Still cycling without Consul: a count to reach, not a rate (a slow box only takes longer).
        wait_for(lambda: ctl.metric("azprobe_controller_cycle_seconds_count") >= cycles + 30, timeout=60,
                 message="30 cycles during the outage")
        assert ctl.healthz()["consul_up"] is False
        assert ctl.metric("azprobe_controller_agents", state="up") == 4

        devconsul.start()
        restarted_at = time.time()
        doc = wait_for(lambda: (d := read_weights(client)) is not None and d.generation > before.generation and d,
                       timeout=20, message="writes resume after Consul returns")
        assert doc.generated_at >= restarted_at - 0.5 and doc.leader == "ctl-1"
        assert ctl.healthz()["consul_up"] is True and ctl.healthz()["leader"] is True

    log = ctl.log()
    # One line per state change, not one per cycle that failed (every cycle of the outage).
    assert log.count("consul lost") == 1, log
    assert log.count("consul regained") == 1, log
    assert log.count("stepped down") == 1, log
    assert log.count("became leader") == 2, log
