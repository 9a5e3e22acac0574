"""`azprobe lab drill`: the click command. Heavy imports happen only when it runs."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import click

from azprobe.dev.demo import DEMO_LAB_NAME
from azprobe.dev.demo.scenarios import DEFAULT_SCENARIO, SCENARIOS, get_scenario
from azprobe.dev.lab.topology import validate_name


@click.command("drill")
@click.option("--modes", default="static,envoy-outlier,azprobe", show_default=True,
              help="Comma-separated: static, envoy-outlier, azprobe.")
@click.option("--scenario", "scenario_name", default=DEFAULT_SCENARIO, show_default=True,
              type=click.Choice(sorted(SCENARIOS)), help="The fault (as `lab demo` has them).")
@click.option("--fault-s", type=float, default=20.0, show_default=True, help="Length of the fault per mode.")
@click.option("--baseline-s", type=float, default=6.0, show_default=True, help="Healthy traffic before the fault.")
@click.option("--recovery-s", type=float, default=8.0, show_default=True, help="Traffic after the clear.")
@click.option("--rate", type=float, default=100.0, show_default=True, help="User requests per second.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the timeline picture here (.png or .svg).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON object.")
@click.option("--fail-static", is_flag=True,
              help="Then: az-b drained and frozen, az-a and az-c blackholed; seconds until users succeed via az-b.")
@click.option("--name", default=DEMO_LAB_NAME, show_default=True, help="Name of the drill's lab.")
def drill_command(modes: str, scenario_name: str, fault_s: float, baseline_s: float, recovery_s: float,
                  rate: float, plot_path: Path | None, as_json: bool, fail_static: bool, name: str) -> None:
    """The chaos drill on user traffic: the same fault through a real Envoy, once per mode."""
    from azprobe.dev.demo.cli import _sigterm_as_interrupt
    from azprobe.dev.drill.runner import DrillSpec

    validate_name(name)
    spec = DrillSpec(scenario=get_scenario(scenario_name), modes=tuple(m.strip() for m in modes.split(",") if m.strip()),
                     fault_s=fault_s, baseline_s=baseline_s, recovery_s=recovery_s, rate=rate)
    if plot_path is not None and plot_path.suffix not in (".png", ".svg"):
        raise click.UsageError("--plot: the file name must end in .png or .svg")
    import azprobe.dev.demo.cli as demo_cli

    demo_cli._DEMO_PID = os.getpid()
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        report, text = run_and_render(spec, name, plot_path, fail_static=fail_static,
                                      progress=lambda m: click.echo(f"azprobe drill: {m}", err=True))
    finally:
        signal.signal(signal.SIGTERM, previous)
    click.echo(json.dumps(report, sort_keys=True) if as_json else text)


def run_and_render(spec, lab_name: str, plot_path: Path | None, *, fail_static: bool = False,  # type: ignore[no-untyped-def]
                   progress=lambda m: None):
    """Stack up, the drill, stack down (always); (JSON document, table text)."""
    from azprobe.dev.demo.runner import LoopStack
    from azprobe.dev.drill.runner import run_drill_modes
    from azprobe.dev.drill.table import render

    stack = LoopStack(lab_name=lab_name)
    try:
        progress("lab, devconsul, agent")
        stack.start(progress)
        result = run_drill_modes(stack, spec, progress)
        doc = result.to_json()
        if plot_path is not None:
            from azprobe.dev.drill.plot import plot_timeline

            plot_timeline(result.figures, plot_path,
                          f"{spec.scenario.description}; {spec.rate:g} requests/s through Envoy")
            doc["plot"] = str(plot_path)
        text = render(result.figures, doc)
        if fail_static:
            from azprobe.dev.drill.failstatic import run_fail_static

            progress("fail-static: az-b drained and frozen, then az-a and az-c blackholed")
            fs = run_fail_static(stack, client_az=spec.client_az, rate=spec.rate)
            doc["fail_static"] = fs.to_json()
            after = "never" if fs.failover_s is None else f"{fs.failover_s:.1f} s"
            text += (f"\nfail-static: users succeed through {fs.drained_az} {after} after "
                     f"{' and '.join(fs.blackholed)} were blackholed ({fs.failed_requests} requests failed meanwhile; "
                     f"no controller running)")
        return doc, text
    finally:
        progress("teardown")
        stack.close()
