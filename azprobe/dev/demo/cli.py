"""`azprobe lab demo`: the click command. Heavy imports happen only when it runs."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

import click

from azprobe.dev.demo.scenarios import DEFAULT_SCENARIO, SCENARIOS, get_scenario
from azprobe.dev.demo import DEMO_LAB_NAME
from azprobe.dev.lab.topology import DEFAULT_NODES_PER_AZ, MAX_NODES_PER_AZ, validate_name


_DEMO_PID = os.getpid()


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    # `kill <demo pid>` must tear down like Ctrl-C does, through the finally blocks. A
    # forked child (pyroute2 forks to create namespaces, and is stopped with SIGTERM)
    # inherits this handler: it must die plainly, never unwind into our teardown.
    if os.getpid() != _DEMO_PID:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise KeyboardInterrupt


@click.command("demo")
@click.option("--scenario", "scenario_name", default=DEFAULT_SCENARIO, show_default=True,
              type=click.Choice(sorted(SCENARIOS)), help="Which fault scenario to run.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON object on the last line.")
@click.option("--fault-s", type=float, default=None,
              help="Length of the fault phase in seconds (default: per scenario, 20-40 s).")
@click.option("--keep", is_flag=True, help="Leave the lab up and keep the logs and configs afterwards.")
@click.option("--name", default=DEMO_LAB_NAME, show_default=True, help="Name of the demo's lab (prefixes its namespaces).")
@click.option("--nodes-per-az", type=click.IntRange(1, MAX_NODES_PER_AZ), default=DEFAULT_NODES_PER_AZ,
              show_default=True, help="Client nodes per AZ, one agent each (the controller's quorum counts nodes).")
@click.option("--users/--no-users", default=True, show_default=True,
              help="User traffic through a real Envoy fed by `envoy-eds --watch`, and at the end the drill's "
                   "table for static weights vs azprobe (short windows).")
def demo_command(scenario_name: str, as_json: bool, fault_s: float | None, keep: bool, name: str,
                 nodes_per_az: int, users: bool) -> None:
    """The closed loop on this machine: lab, devconsul, agent, controller, a fault scenario
    with a live view, recovery, teardown."""
    from azprobe.dev.demo.runner import run_demo
    from azprobe.dev.demo.view import frame, render, render_line

    validate_name(name)
    scenario = get_scenario(scenario_name)
    if fault_s is not None:
        scenario.timeline(fault_s)  # validates --fault-s before anything starts
    tty = sys.stdout.isatty()
    started = time.monotonic()
    screen = {"cleared": False}

    def tick(state) -> None:  # type: ignore[no-untyped-def]
        if tty:
            if not screen["cleared"]:
                sys.stdout.write("\x1b[2J")  # once; later frames overwrite in place
                screen["cleared"] = True
            sick = scenario.sick_azs([z.az for z in state.zones])
            sys.stdout.write(frame(render(state, ansi=True, sick=sick)))
        else:
            sys.stdout.write(render_line(state, time.monotonic() - started) + "\n")
        sys.stdout.flush()

    def progress(message: str) -> None:
        click.echo(f"azprobe demo: {message}", err=True)

    global _DEMO_PID
    _DEMO_PID = os.getpid()
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        report = None
        if users:
            from azprobe.dev.demo.users import run_user_demo

            result, report = run_user_demo(scenario, fault_s=fault_s, keep=keep, tick=tick, progress=progress,
                                           lab_name=name, nodes_per_az=nodes_per_az)
        else:
            result = run_demo(scenario, fault_s=fault_s, keep=keep, tick=tick, progress=progress, lab_name=name,
                              nodes_per_az=nodes_per_az)
    finally:
        signal.signal(signal.SIGTERM, previous)
    doc = result.to_json()
    if report is not None:
        doc["users_drill"] = report.to_json()
    if as_json:
        click.echo(json.dumps(doc, sort_keys=True))
        return
    click.echo(_summary(doc))
    if report is not None:
        from azprobe.dev.drill.table import render as render_drill

        click.echo("\nthe same fault on user traffic through Envoy (short windows: 12 s of fault per mode; "
                   "`azprobe lab drill` runs the full one):")
        click.echo(render_drill(report.figures, report.to_json()))


def _fmt_s(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def _summary(doc: dict[str, Any]) -> str:
    def shares(d: dict[str, int]) -> str:
        return " ".join(f"{az}={s}" for az, s in sorted(d.items())) or "-"

    return "\n".join([
        f"scenario {doc['scenario']} (sick: {', '.join(doc['sick_azs'])})",
        f"  detect  {_fmt_s(doc['detect_s']):>7}  (fault start -> sick AZ's share in KV below 15)",
        f"  recover {_fmt_s(doc['recover_s']):>7}  (fault cleared -> share back within 5 points of baseline)",
        f"  shares before {shares(doc['shares_before'])} | during {shares(doc['shares_during'])}"
        f" | after {shares(doc['shares_after'])}",
        f"  kv writes {doc['kv_writes']}, direction reversals {doc['direction_reversals']}, "
        f"min share {doc['min_share_seen']}, max generation gap {doc['max_generation_gap']:.1f} s",
        f"  states seen: {', '.join(doc['states_seen'])}",
        "  checks: " + ", ".join(f"{name} {'ok' if passed else 'FAILED'}" for name, passed in doc["checks"].items()),
    ])
