"""The weights through `azprobe xds`, end to end in the lab: the documents' drill through
a real Envoy 1.40 fed over ADS (no EDS file), and the same fault through a proxyless
grpcio client whose bootstrap names its zone. The e2e tests' one stack (lab + devconsul +
agents, tests/e2e/conftest.py) serves both; the drills are shortened (12 s of fault) to keep `make test` lean."""

from __future__ import annotations

import pytest

from azprobe.dev.demo.runner import LoopStack
from azprobe.dev.demo.scenarios import get_scenario
from tests.helpers import LAB_SAFETY

pytestmark = [pytest.mark.slow, pytest.mark.lab, pytest.mark.kernel]
SHORT = dict(fault_s=12.0, baseline_s=4.0, recovery_s=4.0, safety=LAB_SAFETY)


def test_envoy_over_ads_holds_the_file_drills_bounds(loop_stack: LoopStack) -> None:
    from azprobe.dev.drill.runner import DrillSpec, run_drill_modes

    spec = DrillSpec(scenario=get_scenario("delay-loss"), modes=("static", "azprobe"), door="ads", **SHORT)
    report = run_drill_modes(loop_stack, spec)
    static, azprobe = report.figures
    context = f"figures: {report.to_json()}"
    print(context)
    # DataPlane.start removes a mode's stale EDS file: one here was written by this run
    written = [m for m in spec.modes if (loop_stack.work_dir / "drill" / m / "eds.json").exists()]
    assert not written, f"an EDS file was written: {written}"
    assert static.after_detection.p99_ms >= 200.0, context
    assert azprobe.detect_s is not None, context
    assert azprobe.after_detection.p99_ms <= max(3 * azprobe.baseline.p99_ms, 25.0), context
    assert azprobe.after_detection.sick_share_envoy <= 0.005, context


def test_proxyless_grpc_follows_the_published_shares_and_drains_the_sick_zone(loop_stack: LoopStack) -> None:
    from azprobe.dev.drill.proxyless import run_proxyless
    from azprobe.dev.drill.runner import DrillSpec

    # gRPC's locality picker is weighted-random: 250 calls/s puts ~1,000 calls in the
    # 4 s before the fault, so a share's sampling error is ~1.5 points against the ±5 bound.
    spec = DrillSpec(scenario=get_scenario("delay-loss"), rate=250.0, **SHORT)
    result = run_proxyless(loop_stack, spec)
    f = result.figures
    after_clear = [(round(b.t, 1), round(sum(b.shares.get(az, 0.0) for az in f.sick_azs), 3))
                   for b in f.timeline if b.t >= f.fault_s]
    context = f"figures: {result.to_json()} sick share after the clear: {after_clear}"
    print(context)
    for az, share in result.published_before.items():
        assert abs(result.client_before[az] - share) <= 5.0, (az, context)
    assert f.detect_s is not None, context
    assert f.after_detection.sick_share_client <= 0.005, context
    assert f.recover_s is not None, context  # the sick zone's share comes back
