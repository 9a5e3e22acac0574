"""The data plane, end to end: a real Envoy in a lab namespace, real HTTP servers in every
AZ, real faults in the kernel, and the whole azprobe loop (BPF agent, controller,
devconsul, envoy-eds --watch) against static weights; then fail-static.

The e2e tests' one stack (lab + devconsul + agents, tests/e2e/conftest.py) serves them. The drill is
shortened (12 s of fault) to keep `make test` lean; bench/drill.py runs the full one.
"""

from __future__ import annotations

import pytest

from azprobe.dev.demo.runner import LoopStack
from azprobe.dev.demo.scenarios import get_scenario
from tests.helpers import LAB_SAFETY

pytestmark = [pytest.mark.slow, pytest.mark.lab, pytest.mark.kernel]


def test_azprobe_keeps_user_p99_where_static_weights_feel_the_fault(loop_stack: LoopStack) -> None:
    from azprobe.dev.drill.runner import DrillSpec, run_drill_modes

    spec = DrillSpec(scenario=get_scenario("delay-loss"), modes=("static", "azprobe"), fault_s=12.0,
                     baseline_s=4.0, recovery_s=4.0, safety=LAB_SAFETY)
    report = run_drill_modes(loop_stack, spec)
    static, azprobe = report.figures
    context = f"figures: {report.to_json()}"
    # The fault bites without azprobe: a third of the requests take +200 ms.
    assert static.after_detection.p99_ms >= 200.0, context
    assert static.after_detection.sick_share_envoy > 0.2, context
    # With azprobe the sick zone is drained and the users do not feel it.
    assert azprobe.detect_s is not None, context
    bound = max(3 * azprobe.baseline.p99_ms, 25.0)
    assert azprobe.after_detection.p99_ms <= bound, context
    assert azprobe.after_detection.success_pct >= static.after_detection.success_pct, context
    assert azprobe.after_detection.sick_share_envoy <= 0.005, context
    assert azprobe.after_detection.sick_share_client <= 0.005, context
    # Envoy's counters and the client's view agree on where the requests went.
    assert abs(static.after_detection.sick_share_envoy - static.after_detection.sick_share_client) < 0.05, context


def test_fail_static_a_drained_zone_takes_the_traffic_when_the_others_die(loop_stack: LoopStack) -> None:
    from azprobe.dev.drill.failstatic import run_fail_static

    result = run_fail_static(loop_stack, drained="az-b", blackhole_s=10.0)
    context = f"fail-static: {result.to_json()}"
    print(context)
    assert result.share_before is not None and result.share_before <= 0.005, context  # drained: no traffic
    assert result.failover_s is not None, context  # users succeed through az-b, no controller involved
    assert result.success_after_pct >= 99.0, context


def test_the_scheduler_extender_keeps_new_pods_out_of_the_sick_az_and_fails_none(loop_stack: LoopStack) -> None:
    """`azprobe lab drill --consumer scheduler`, short: pods through the extender during the
    fault, then the documents' incident (key deleted, Consul stopped, stale document)."""
    from azprobe.dev.drill.scheduler import run_scheduler_drill

    report = run_scheduler_drill(loop_stack, get_scenario("delay-loss"), fault_s=10.0, rate=20.0, incident_s=2.0,
                                 safety=LAB_SAFETY)
    context = f"figures: {report.to_json()}"
    phases = {p.phase: p for p in report.phases}
    assert report.detect_s is not None, context
    assert report.failed_total() == 0, context
    assert phases["fault, after detection"].pods > 0, context
    assert phases["fault, after detection"].sick_share_pct <= 5.0, context
    for name in ("incident: key deleted", "incident: Consul stopped", "incident: stale document"):
        phase = phases[name]
        assert phase.pods > 0 and phase.failed == 0, context
        # The extender neither acts on what it cannot trust nor skews: no node filtered (the
        # stale document would filter the sick AZ), scores even or neutral. The shares over a
        # phase this short reflect the placer evening out its running pods, so each AZ only
        # has to get some.
        assert phase.filtered_nodes == 0, context
        assert phase.max_score_range <= 2, context
        assert min(phase.shares_pct.values()) > 0.0, context
