"""The data plane, end to end: a real Envoy in a lab namespace, real HTTP servers in every
AZ, real faults in the kernel, and the whole azprobe loop (BPF agent, controller,
devconsul, envoy-eds --watch) against static weights; then fail-static.

One stack (lab + devconsul + agent) serves both tests (module fixture). The drill is
shortened (12 s of fault) to keep `make test` lean; bench/drill.py runs the full one.
"""

from __future__ import annotations

import os

import pytest

from azprobe.dev.demo.runner import LoopStack
from azprobe.dev.demo.scenarios import get_scenario

pytestmark = [pytest.mark.slow, pytest.mark.lab, pytest.mark.kernel]


@pytest.fixture(scope="module")
def stack():
    if os.geteuid() != 0:
        pytest.skip("needs root: network namespaces and BPF")
    from azprobe.dev.lab.envoy import envoy_binary
    from azprobe.dev.lab.lab import unique_lab_name

    envoy_binary()  # a missing Envoy is a setup error, said up front
    with LoopStack(lab_name=unique_lab_name("dr")) as s:
        yield s


def test_azprobe_keeps_user_p99_where_static_weights_feel_the_fault(stack: LoopStack) -> None:
    from azprobe.dev.drill.runner import DrillSpec, run_drill_modes

    spec = DrillSpec(scenario=get_scenario("delay-loss"), modes=("static", "azprobe"), fault_s=12.0,
                     baseline_s=4.0, recovery_s=4.0)
    report = run_drill_modes(stack, spec)
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


def test_fail_static_a_drained_zone_takes_the_traffic_when_the_others_die(stack: LoopStack) -> None:
    from azprobe.dev.drill.failstatic import run_fail_static

    result = run_fail_static(stack, drained="az-b", blackhole_s=10.0)
    context = f"fail-static: {result.to_json()}"
    print(context)
    assert result.share_before is not None and result.share_before <= 0.005, context  # drained: no traffic
    assert result.failover_s is not None, context  # users succeed through az-b, no controller involved
    assert result.success_after_pct >= 99.0, context
