"""`azprobe devconsul`: run the embedded Consul-API server in the foreground."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys

import click
from aiohttp import web

from azprobe.daemon.address_file import format_host_port, write_address_file
from azprobe.config import parse_host_port, read_token_file
from azprobe.dev.devconsul.connlimit import DEFAULT_MAX_CONNS_PER_CLIENT, ConnLimiter
from azprobe.errors import AzprobeError, ConfigError

log = logging.getLogger(__name__)


SHUTDOWN_TIMEOUT_S = 2.0  # requests still running this long after SIGTERM are cut


async def serve(host: str, port: int, node_name: str, datacenter: str, data_dir: str | None,
                acl_master_token: str | None, max_conns_per_client: int = DEFAULT_MAX_CONNS_PER_CLIENT,
                address_file: str | None = None) -> None:
    from azprobe.dev.devconsul.http import build_app
    from azprobe.dev.devconsul.server import DevConsulServer

    try:
        server = DevConsulServer(node_name=node_name, datacenter=datacenter, acl_master_token=acl_master_token,
                                 data_dir=data_dir,
                                 advertise_addr=host if host not in ("0.0.0.0", "::") else "127.0.0.1")
    except OSError as exc:
        raise ConfigError("--data-dir", f"cannot use {data_dir!r}: {exc.strerror or exc}",
                          "give a writable directory") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError("--data-dir", f"the snapshot in {data_dir!r} is unreadable: {exc}",
                          "restore it from a backup or move it away to start empty") from None
    # handler_cancellation: a client that hangs up frees its blocking query (and its
    # connection's slot under --max-conns-per-client) at once, as Consul does, instead of
    # after its `wait`. Safe: every store commit is synchronous, so a cancel can only land
    # on an await.
    runner = web.AppRunner(build_app(server), access_log=None, handle_signals=False,
                           shutdown_timeout=SHUTDOWN_TIMEOUT_S, handler_cancellation=True)
    await runner.setup()
    loop = asyncio.get_running_loop()
    try:
        # Consul's per-client limit is on connections, so it sits in front of aiohttp's
        # request handler, on the listener (connlimit.py).
        listener = await loop.create_server(ConnLimiter(max_conns_per_client).factory(runner.server), host, port,
                                            reuse_address=True)
    except OSError as exc:
        await runner.cleanup()
        reason = (exc.strerror or str(exc)).rsplit(": ", 1)[-1]
        raise ConfigError("--http-addr", f"cannot listen on {host}:{port}: {reason}",
                          "pick a free port, e.g. --http-addr 127.0.0.1:18500") from None
    port = listener.sockets[0].getsockname()[1]  # the real one for port 0
    print(f"devconsul: serving Consul HTTP API on http://{format_host_port(host, port)} "
          f"(node {node_name}, dc {datacenter}, index {server.store.index}, "
          f"acl {'on' if server.acl.enabled else 'off'}, data-dir {data_dir or 'none (in memory)'})",
          flush=True)
    if address_file:
        write_address_file(address_file, host, port)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        # Parked blocking queries answer first (a gone client's would otherwise hold the
        # shutdown for its whole `wait`, ~62 s), then the rest get SHUTDOWN_TIMEOUT_S.
        listener.close()
        server.waiters.release_all()
        await runner.cleanup()
        await listener.wait_closed()


@click.command("devconsul")
@click.option("--http-addr", default="127.0.0.1:8500", show_default=True,
              help="host:port to serve the HTTP API on (port 0: any free port).")
@click.option("--address-file", default=None, type=click.Path(dir_okay=False),
              help="Once serving, write the bound host:port here (for --http-addr port 0).")
@click.option("--data-dir", default=None, type=click.Path(file_okay=False),
              help="Keep state here (write-ahead log + snapshot); default: in memory only.")
@click.option("--acl-master-token-file", default=None, type=click.Path(dir_okay=False),
              help="Enable ACLs (default deny) with the management token in this file (or set "
                   "DEVCONSUL_ACL_MASTER_TOKEN). Never on the command line: /proc/PID/cmdline shows it.")
@click.option("--max-conns-per-client", default=DEFAULT_MAX_CONNS_PER_CLIENT, show_default=True,
              type=click.IntRange(1, 1_000_000),
              help="Connections one client IP may hold open (Consul's limits.http_max_conns_per_client); "
                   "a new one beyond it gets 429 and is closed, open ones are kept.")
@click.option("--node-name", default=None, help="This node's name in the catalog [default: hostname].")
@click.option("--datacenter", default="dc1", show_default=True, help="Datacenter name.")
def devconsul_command(http_addr: str, address_file: str | None, data_dir: str | None,
                      acl_master_token_file: str | None,
                      max_conns_per_client: int, node_name: str | None, datacenter: str) -> None:
    """Embedded server speaking Consul's HTTP API (KV, txn, sessions, status, catalog)."""
    host, port = parse_host_port(http_addr, "--http-addr", listen=True)
    acl_master_token = master_token(acl_master_token_file, os.environ.get("DEVCONSUL_ACL_MASTER_TOKEN"))
    if not datacenter or not datacenter.replace("-", "").replace("_", "").isalnum():
        raise ConfigError("--datacenter", f"{datacenter!r} is not a valid name", "use letters, digits, - and _")
    asyncio.run(serve(host, port, node_name or socket.gethostname(), datacenter, data_dir, acl_master_token,
                      max_conns_per_client, address_file))


def master_token(path: str | None, env_value: str | None) -> str | None:
    """The ACL master token from --acl-master-token-file, else DEVCONSUL_ACL_MASTER_TOKEN;
    None: ACLs off."""
    if path is not None:
        return read_token_file(path, "--acl-master-token-file")
    if env_value is not None:
        if not env_value.strip():
            raise ConfigError("DEVCONSUL_ACL_MASTER_TOKEN", "is empty", "set a token or unset the variable")
        return env_value.strip()
    return None


def main() -> None:
    try:
        devconsul_command(standalone_mode=False)
    except AzprobeError as exc:
        print(f"azprobe: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2)
    except click.exceptions.Abort:
        sys.exit(1)
