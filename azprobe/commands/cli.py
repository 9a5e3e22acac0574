"""The `azprobe` command. Subcommands live in their own modules and load lazily, so
`azprobe weights` never imports BCC and `azprobe agent` never imports the lab."""

from __future__ import annotations

import importlib
import logging
import sys

import click

from azprobe.contracts.window import printable
from azprobe.errors import AzprobeError

# command name -> ("module:attribute" of a click.Command, one-line help for the listing)
COMMANDS: dict[str, tuple[str, str]] = {
    "agent": ("azprobe.agent.main:agent_command", "Run the node agent: load the probe, serve windows."),
    "top": ("azprobe.commands.top:top_command", "Live per-path table from an agent."),
    "trace": ("azprobe.commands.trace:trace_command", "Live view of SYN retransmits, RTOs, failed connects."),
    "lab": ("azprobe.dev.lab.cli:lab_group", "Simulated availability zones in network namespaces."),
    "devconsul": ("azprobe.dev.devconsul.cli:devconsul_command", "Embedded Consul-API server for dev and tests."),
    "weights": ("azprobe.consumers.weights_cli:weights_command", "Show the weights in Consul KV."),
    "envoy-eds": ("azprobe.consumers.envoy:envoy_eds_command", "Render Envoy file-EDS from the weights."),
    "xds": ("azprobe.consumers.xds.main:xds_group", "xDS server: the weights for Envoy (ADS/EDS) and gRPC clients."),
    "controller": ("azprobe.controller.main:controller_command", "Run the controller: windows in, weights out."),
    "model": ("azprobe.controller.model_cli:model_group", "Evaluate weight models on given stats."),
    "scheduler-extender": ("azprobe.consumers.scheduler.server:scheduler_extender_command",
                           "Serve kube-scheduler's extender protocol from the weights."),
    "explain": ("azprobe.consumers.explain:explain_command", "Why each AZ has the weight it has."),
    "doctor": ("azprobe.commands.doctor:doctor_command", "Preflight checks for the agent or controller."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module_name, attr = entry[0].split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # A node install (`make install`) leaves the dev tools out; a missing optional
            # dependency is said by name, instead of a traceback.
            if module_name.startswith("azprobe.dev.") and exc.name in ("azprobe.dev", module_name):
                raise click.UsageError(f"'{cmd_name}' is a dev tool and is not installed on this node "
                                       "(make install leaves it out); run it from a source checkout "
                                       "with `make setup`") from exc
            raise click.ClickException(f"'{cmd_name}' is unavailable: {exc}") from exc
        return getattr(module, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # The listing uses the static help, so `azprobe --help` imports nothing heavy.
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.version_option(package_name="azprobe")
def cli(verbose: int) -> None:
    """azprobe: TCP health between availability zones, turned into routing weights."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main() -> None:
    try:
        result = cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except AzprobeError as exc:
        click.echo(f"azprobe: {printable(str(exc), 2000)}", err=True)  # may quote a peer's words
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    # With standalone_mode off, click returns ctx.exit()'s code instead of exiting.
    if isinstance(result, int) and not isinstance(result, bool):
        sys.exit(result)


if __name__ == "__main__":
    main()
