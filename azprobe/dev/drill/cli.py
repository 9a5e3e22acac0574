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
@click.option("--consumer", type=click.Choice(["envoy", "scheduler"]), default="envoy", show_default=True,
              help="envoy: user requests through Envoy; scheduler: pods placed through the scheduler extender.")
@click.option("--pods-per-s", type=float, default=20.0, show_default=True,
              help="--consumer scheduler: pods placed per second.")
@click.option("--nodes-per-az", type=int, default=4, show_default=True,
              help="--consumer scheduler: Kubernetes nodes per AZ the placer chooses from.")
@click.option("--door", type=click.Choice(["file", "ads"]), default="file", show_default=True,
              help="How Envoy gets its endpoints: file (envoy-eds --watch) or ads (azprobe xds serve).")
@click.option("--servers-per-az", type=int, default=None,
              help="Servers per AZ in the lab (default: what the scenario needs; gray-host/gray-zone: 6).")
def drill_command(modes: str, scenario_name: str, fault_s: float, baseline_s: float, recovery_s: float,
                  rate: float, plot_path: Path | None, as_json: bool, fail_static: bool, name: str,
                  consumer: str, pods_per_s: float, nodes_per_az: int, door: str, servers_per_az: int | None) -> None:
    """The chaos drill on user traffic: the same fault through a real Envoy, once per mode;
    or (--consumer scheduler) pods placed through the scheduler extender; or (--scenario
    gray-host, gray-zone) the host drill: one sick server, then most of a zone sick."""
    from azprobe.dev.demo.cli import _sigterm_as_interrupt
    from azprobe.dev.drill.hostdrill import host_drill_phases
    from azprobe.dev.drill.runner import DrillSpec

    validate_name(name)
    phases = host_drill_phases(scenario_name)
    if phases is not None and consumer == "envoy":
        needed = max(p.servers_per_az for p in phases)
        if servers_per_az is not None and not needed <= servers_per_az <= 32:
            raise click.UsageError(f"--servers-per-az must be within {needed}..32 for scenario {scenario_name}")
        import azprobe.dev.demo.cli as demo_cli

        demo_cli._DEMO_PID = os.getpid()
        previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
        try:
            run_hosts(phases, name, door, servers_per_az or needed, rate, fault_s, as_json)
        finally:
            signal.signal(signal.SIGTERM, previous)
        return
    if consumer == "scheduler":
        if not 1.0 <= pods_per_s <= 200 or not 1 <= nodes_per_az <= 1000:
            raise click.UsageError("--pods-per-s must be within 1..200 and --nodes-per-az within 1..1000")
        run_scheduler(get_scenario(scenario_name), name, fault_s, pods_per_s, nodes_per_az, as_json)
        return
    spec = DrillSpec(scenario=get_scenario(scenario_name), modes=tuple(m.strip() for m in modes.split(",") if m.strip()),
                     fault_s=fault_s, baseline_s=baseline_s, recovery_s=recovery_s, rate=rate, door=door)
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

    stack = LoopStack(lab_name=lab_name, servers_per_az=spec.scenario.servers_per_az)
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


def run_scheduler(scenario, lab_name: str, fault_s: float, pods_per_s: float, nodes_per_az: int,  # type: ignore[no-untyped-def]
                  as_json: bool) -> None:
    """Stack up, the scheduling drill, stack down (always); the table or JSON on stdout."""
    from azprobe.dev.demo.runner import LoopStack
    from azprobe.dev.drill.scheduler import render, run_scheduler_drill

    def progress(message: str) -> None:
        click.echo(f"azprobe drill: {message}", err=True)

    stack = LoopStack(lab_name=lab_name)
    try:
        progress("lab, devconsul, agent")
        stack.start(progress)
        report = run_scheduler_drill(stack, scenario, fault_s=fault_s, rate=pods_per_s, nodes_per_az=nodes_per_az,
                                     progress=progress)
    finally:
        progress("teardown")
        stack.close()
    click.echo(json.dumps(report.to_json(), sort_keys=True) if as_json else render(report))


def run_hosts(phases, lab_name: str, door: str, servers_per_az: int, rate: float, fault_s: float,  # type: ignore[no-untyped-def]
              as_json: bool) -> None:
    """Stack up, the host drill's phases, stack down (always); one JSON line per phase
    (--json: one document)."""
    from azprobe.dev.demo.runner import LoopStack
    from azprobe.dev.drill.hostdrill import HOST_LAB_TRAFFIC, run_host_drill

    def progress(message: str) -> None:
        click.echo(f"azprobe drill: {message}", err=True)

    stack = LoopStack(lab_name=lab_name, servers_per_az=servers_per_az, traffic=HOST_LAB_TRAFFIC)
    try:
        progress(f"lab ({servers_per_az} servers per AZ), devconsul, agents")
        stack.start(progress)
        report = run_host_drill(stack, phases, door=door, rate=rate, fault_s=fault_s, progress=progress)
    finally:
        progress("teardown")
        stack.close()
    doc = report.to_json()
    if as_json:
        click.echo(json.dumps(doc, sort_keys=True))
        return
    for phase in doc["phases"]:
        click.echo(json.dumps({"door": door, "servers_per_az": servers_per_az, **phase}, sort_keys=True))
