"""Leader election and fencing against a real devconsul: exactly one leader among two
controller processes; SIGKILL the leader and the standby writes within lock-delay + 2 s
(its probe finds the dead leader silent and invalidates the session); a deposed leader's
write is rejected by the txn; a lost session steps down and re-acquires."""

from __future__ import annotations


import consul
import pytest

from azprobe.clients.consul import ConsulSettings, make_client
from azprobe.contracts.weights import ZoneWeights
from azprobe.controller.config import parse_config
from azprobe.controller.leader import LeaderElection, LeaderProbe, probe_healthz
from azprobe.controller.main import Controller
from azprobe.controller.publish import GLOBAL_VIEW, Fenced, Publisher, WeightsView
from tests.controller_harness import ControllerProcess, leader_holder, read_weights
from tests.fakeagent import FakeAgentServer, zone_agents
from tests.helpers import wait_for

LOCK_DELAY_S = 1.0
SESSION_TTL_S = 10.0  # Consul's minimum; devconsul (like Consul) expires after 2 x TTL


def _views(shares: dict[str, int]) -> dict[str, WeightsView]:
    zones = {az: ZoneWeights(weight=1.0, share=s, health=1.0, success=1.0, p95_ms=1.0, util=0.1, samples=100,
                             state="ok", reasons=("test",)) for az, s in shares.items()}
    return {GLOBAL_VIEW: WeightsView(state="ok", zones=zones)}


def _elector(client: consul.Consul, settings: ConsulSettings, name: str) -> LeaderElection:
    return LeaderElection(client, settings, name=name, address="127.0.0.1:1", ttl_s=SESSION_TTL_S,
                          lock_delay_s=LOCK_DELAY_S)


def test_deposed_leader_write_is_rejected_by_the_txn(devconsul):
    settings = ConsulSettings(address=devconsul.url)
    client = make_client(settings)
    old = _elector(client, settings, "old")
    assert old.tick() is not None and old.is_leader
    publisher = Publisher(client, settings, leader_name="old", model_name="default")
    assert publisher.start_term() == 0
    written = publisher.publish(old.session_id, _views({"az-a": 50, "az-b": 50}))
    assert written is not None and written.generation == 1

    # The old leader's session dies behind its back (expiry, operator, partition)...
    assert client.session.destroy(old.session_id)
    new = _elector(client, settings, "new")
    wait_for(lambda: new.tick() is not None and new.is_leader, timeout=LOCK_DELAY_S + 5,
             message="new leader after the lock-delay")
    successor = Publisher(client, settings, leader_name="new", model_name="default")
    assert successor.start_term() == 1  # continues above the generation in KV
    assert successor.publish(new.session_id, _views({"az-a": 70, "az-b": 30})).generation == 2

    # ... and its next write, still believing it leads, is rolled back as a whole.
    with pytest.raises(Fenced) as exc:
        publisher.publish(old.session_id, _views({"az-a": 10, "az-b": 90}), force=True)
    assert exc.value.conflict.errors and exc.value.conflict.errors[0]["OpIndex"] == 0
    assert publisher.counters.conflicts == 1
    doc = read_weights(client)
    assert doc.leader == "new" and doc.generation == 2 and doc.zones["az-a"].share == 70
    # A live session that never held the lock is fenced just the same.
    intruder = client.session.create(ttl=10)
    with pytest.raises(Fenced):
        publisher.publish(intruder, _views({"az-a": 1, "az-b": 99}), force=True)
    assert read_weights(client).generation == 2


def test_controller_steps_down_on_409(devconsul, caplog):
    """The daemon's Consul round: a fenced write (409) makes it a standby at once."""
    config = parse_config({"controller": {"name": "ctl", "listen": "127.0.0.1:9", "lock_delay_s": LOCK_DELAY_S},
                           "consul": {"address": devconsul.url}, "agents": {"static": ["http://127.0.0.1:9"]},
                           "topology": {"azs": ["az-a", "az-b", "az-c"]}})
    ctl = Controller(config)
    client = ctl.consul.client
    ctl.handover.offer_views(_views({"az-a": 60, "az-b": 40}))
    ctl.consul_tick()
    assert ctl.consul.election.is_leader and read_weights(client).generation == 1
    # Someone removes the lock key: our session is alive but no longer holds the lock.
    client.kv.delete("azprobe/v1/leader")
    ctl.handover.offer_views(_views({"az-a": 30, "az-b": 70}))
    with caplog.at_level("INFO"):
        ctl.consul_tick()
    assert not ctl.consul.election.is_leader
    assert ctl.consul.publisher.counters.conflicts == 1
    assert read_weights(client).zones["az-a"].share == 60  # the rejected write left nothing behind
    assert any("stepped down" in r.getMessage() and "409" in r.getMessage() for r in caplog.records)
    assert ctl.metrics.leader._value.get() == 0
    # Next round it may take the free lock again, and continues above the last generation.
    ctl.consul_tick()
    assert ctl.consul.election.is_leader
    doc = read_weights(client)
    assert doc.zones["az-a"].share == 30 and doc.generation > 1
    ctl.consul.election.release()


def test_two_controllers_one_leader_and_failover_after_sigkill(devconsul, tmp_path):
    """Exactly one leader; SIGKILL it and the standby takes over without waiting for the
    dead session's TTL: it finds the leader's advertised /healthz silent, invalidates the
    dead session (Consul alone would keep it for 2 x TTL = 20 s), and takes the lock after
    the lock-delay. (How long that takes is a figure: bench/loop.py --scenario
    controller-failover; here only the order of events is asserted.)"""
    client = consul.Consul(host=devconsul.host, port=devconsul.port)
    server = FakeAgentServer(interval_s=0.2)
    for key, agent in zone_agents(["az-a", "az-b"], 2).items():
        server.add(key, agent)
    with server:
        urls = [server.url(k) for k in server.agents]
        with ControllerProcess.make(tmp_path, "ctl-1", devconsul.url, urls, lock_delay_s=LOCK_DELAY_S) as one, \
                ControllerProcess.make(tmp_path, "ctl-2", devconsul.url, urls, lock_delay_s=LOCK_DELAY_S) as two:
            procs = {"ctl-1": one, "ctl-2": two}
            holder = wait_for(lambda: leader_holder(client), timeout=15, message="a leader")
            leader, standby = procs[holder["name"]], procs["ctl-1" if holder["name"] == "ctl-2" else "ctl-2"]
            wait_for(lambda: (d := read_weights(client)) is not None and d.leader == leader.name, timeout=15,
                     message="the leader writes")
            # Exactly one leader: both processes agree, and both are pulling agents (warm standby).
            wait_for(lambda: standby.healthz() is not None and leader.healthz() is not None, timeout=10,
                     message="both healthy")
            assert leader.healthz()["leader"] is True and standby.healthz()["leader"] is False
            assert leader.metric("azprobe_controller_leader") == 1 and standby.metric("azprobe_controller_leader") == 0
            assert standby.metric("azprobe_controller_collect_windows_ingested_total") > 0
            # The standby's probe does not depose a live leader: many rounds later, same holder.
            cycles = standby.metric("azprobe_controller_cycle_seconds_count")
            wait_for(lambda: standby.metric("azprobe_controller_cycle_seconds_count") >= cycles + 10, timeout=10,
                     message="ten standby rounds")
            assert leader_holder(client)["session"] == holder["session"]
            before = read_weights(client).generation

            leader.kill()
            doc = wait_for(lambda: (d := read_weights(client)) is not None and d.leader == standby.name and d,
                           timeout=2 * SESSION_TTL_S + LOCK_DELAY_S + 10, interval=0.02,
                           message="the standby writes")
            assert doc.generation > before
            # Warm start: its first document already rests on evidence it pulled as a standby.
            assert all(z.samples >= 20 and z.state == "ok" for z in doc.zones.values())
            assert standby.healthz()["leader"] is True
            # The order of events: the standby destroyed the dead leader's session while it
            # still held the lock (a session expired by its TTL holds no lock, so there
            # would be nobody to probe), then won the election.
            log = standby.log()
            deposed = log.find(f"leader {leader.name!r} at 127.0.0.1:{leader.port} did not answer 3 probes in a row")
            assert deposed >= 0, log
            assert log.find("became leader", deposed) > deposed, log


def test_probe_deposes_only_a_silent_leader(devconsul):
    settings = ConsulSettings(address=devconsul.url)
    client = make_client(settings)
    leader = LeaderElection(client, settings, name="ctl-1", address="127.0.0.1:1", ttl_s=SESSION_TTL_S,
                            lock_delay_s=LOCK_DELAY_S)
    leader.tick()
    standby = LeaderElection(client, settings, name="ctl-2", address="127.0.0.1:2", ttl_s=SESSION_TTL_S,
                             lock_delay_s=LOCK_DELAY_S)
    answers: list[str | None] = []
    probe = LeaderProbe(client, own_name="ctl-2", failures_needed=3, timeout_s=0.1,
                        probe=lambda address, timeout: answers.pop(0))
    # Silence twice, then an answer (even from another controller at that address):
    # the count starts over, nothing is invalidated.
    answers += [None, None, "someone-else", None, None]
    for _ in range(5):
        assert probe.observe(standby.holder()) is None
    assert leader_holder(client)["session"] == leader.session_id
    answers += [None]  # the third silence in a row
    reason = probe.observe(standby.holder())
    assert reason and "ctl-1" in reason and "3 probes" in reason
    assert leader_holder(client) is None  # session gone, lock released (lock-delay running)
    # Its own lock, or no advertised address, is never probed.
    assert probe.observe({"name": "ctl-2", "address": "x:1", "session": "s"}) is None
    assert probe.observe({"name": "ctl-1", "address": "", "session": "s"}) is None
    assert answers == []


@pytest.mark.parametrize("address", ["127.0.0.1:abc", "a" * 70 + ".example:80", "[::1"],
                         ids=["port-not-a-number", "label-over-63", "open-bracket"])
def test_a_leader_key_address_that_is_no_address_is_silence_not_a_crash(devconsul, address):
    """The leader key's address is KV input: one that urllib cannot even parse (InvalidURL,
    UnicodeError) makes the probe see silence, so the standby's round goes on and a holder
    nobody can reach is deposed like a dead one."""
    assert probe_healthz(address, 0.1) is None
    settings = ConsulSettings(address=devconsul.url)
    client = make_client(settings)
    leader = LeaderElection(client, settings, name="ctl-1", address=address, ttl_s=SESSION_TTL_S,
                            lock_delay_s=LOCK_DELAY_S)
    leader.tick()
    standby = _elector(client, settings, "ctl-2")
    probe = LeaderProbe(client, own_name="ctl-2", failures_needed=3, timeout_s=0.1)
    assert probe.observe(standby.holder()) is None and probe.observe(standby.holder()) is None
    reason = probe.observe(standby.holder())
    assert reason and "ctl-1" in reason and leader_holder(client) is None


def test_lost_session_steps_down_then_reacquires_with_a_new_one(devconsul, caplog):
    """What a long Consul outage leaves behind: our session expired. The renew answers 404,
    we step down at once, create a new session and take the lock after the lock-delay."""
    settings = ConsulSettings(address=devconsul.url)
    client = make_client(settings)
    election = _elector(client, settings, "ctl")
    assert election.tick() is not None and election.is_leader
    old_session = election.session_id
    assert client.session.destroy(old_session)  # as the TTL expiry would
    election._renewed_at = float("-inf")  # the renew is due now
    with caplog.at_level("INFO", logger="azprobe.controller.leader"):
        transition = election.tick()
    assert transition is not None and not transition.became_leader and "404" in transition.reason
    assert not election.is_leader and election.session_id not in (None, old_session)
    wait_for(lambda: election.tick() is not None or election.is_leader, timeout=LOCK_DELAY_S + 5,
             message="lock re-acquired after the lock-delay")
    assert election.is_leader and leader_holder(client)["session"] == election.session_id
    assert sum("stepped down" in r.getMessage() for r in caplog.records) == 1
    election.release()
    assert leader_holder(client) is None  # a clean release frees the lock at once
