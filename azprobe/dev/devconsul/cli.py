"""`azprobe devconsul`: run the embedded Consul-API server in the foreground."""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import logging
import os
import signal
import socket
import ssl
import sys
from collections.abc import Callable

import click
from aiohttp import web

from azprobe.daemon.address_file import format_host_port, write_address_file
from azprobe.config import parse_host_port, read_token_file
from azprobe.dev.devconsul.connlimit import DEFAULT_MAX_CONNS_PER_CLIENT, ConnLimiter
from azprobe.errors import AzprobeError, ConfigError
from azprobe.security.tls import RotatingContext, TlsFiles, server_context

log = logging.getLogger(__name__)


SHUTDOWN_TIMEOUT_S = 2.0  # requests still running this long after SIGTERM are cut


async def serve(host: str, port: int, node_name: str, datacenter: str, data_dir: str | None,
                acl_master_token: str | None, max_conns_per_client: int = DEFAULT_MAX_CONNS_PER_CLIENT,
                address_file: str | None = None, tls: RotatingContext | None = None) -> None:
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
        factory = ConnLimiter(max_conns_per_client).factory(runner.server)
        if tls is not None:
            factory = tls_factory(factory, tls.serving_context(), loop)
        listener = await loop.create_server(factory, host, port, reuse_address=True)
    except OSError as exc:
        await runner.cleanup()
        reason = (exc.strerror or str(exc)).rsplit(": ", 1)[-1]
        raise ConfigError("--http-addr", f"cannot listen on {host}:{port}: {reason}",
                          "pick a free port, e.g. --http-addr 127.0.0.1:18500") from None
    port = listener.sockets[0].getsockname()[1]  # the real one for port 0
    print(f"devconsul: serving Consul HTTP API on {'https' if tls else 'http'}://{format_host_port(host, port)} "
          f"(node {node_name}, dc {datacenter}, index {server.store.index}, "
          f"acl {'on' if server.acl.enabled else 'off'}, {_tls_mode(tls)}, "
          f"data-dir {data_dir or 'none (in memory)'})", flush=True)
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
@click.option("--tls-cert-file", default=None, type=click.Path(dir_okay=False),
              help="Serve HTTPS with this certificate chain (PEM), with --tls-key-file.")
@click.option("--tls-key-file", default=None, type=click.Path(dir_okay=False),
              help="The key of --tls-cert-file (PEM, mode 0600).")
@click.option("--tls-ca-file", default=None, type=click.Path(dir_okay=False),
              help="The CA that signs clients' certificates (for --verify-incoming).")
@click.option("--verify-incoming", is_flag=True,
              help="Refuse the TLS handshake of a client without a certificate signed by --tls-ca-file "
                   "(Consul's tls.https.verify_incoming).")
@click.option("--node-name", default=None, help="This node's name in the catalog [default: hostname].")
@click.option("--datacenter", default="dc1", show_default=True, help="Datacenter name.")
def devconsul_command(http_addr: str, address_file: str | None, data_dir: str | None,
                      acl_master_token_file: str | None, max_conns_per_client: int, tls_cert_file: str | None,
                      tls_key_file: str | None, tls_ca_file: str | None, verify_incoming: bool,
                      node_name: str | None, datacenter: str) -> None:
    """Embedded server speaking Consul's HTTP API (KV, txn, sessions, status, catalog)."""
    host, port = parse_host_port(http_addr, "--http-addr", listen=True)
    tls = tls_context(tls_cert_file, tls_key_file, tls_ca_file, verify_incoming)
    acl_master_token = master_token(acl_master_token_file, os.environ.get("DEVCONSUL_ACL_MASTER_TOKEN"))
    if not datacenter or not datacenter.replace("-", "").replace("_", "").isalnum():
        raise ConfigError("--datacenter", f"{datacenter!r} is not a valid name", "use letters, digits, - and _")
    asyncio.run(serve(host, port, node_name or socket.gethostname(), datacenter, data_dir, acl_master_token,
                      max_conns_per_client, address_file, tls))


def tls_context(cert_file: str | None, key_file: str | None, ca_file: str | None,
                verify_incoming: bool) -> RotatingContext | None:
    """The HTTPS listener's context (None: plain HTTP), rebuilt when its files change."""
    if not (cert_file or key_file or ca_file or verify_incoming):
        return None
    if not (cert_file and key_file):
        raise ConfigError("--tls-cert-file", "HTTPS needs --tls-cert-file and --tls-key-file", "give both")
    if verify_incoming and not ca_file:
        raise ConfigError("--verify-incoming", "needs --tls-ca-file, the CA clients' certificates are checked "
                          "against", "give --tls-ca-file")
    # The CA is handed to the server only with --verify-incoming: it is what makes the
    # handshake ask for (and require) a client certificate.
    files = TlsFiles(cert_file=cert_file, key_file=key_file, ca_file=ca_file if verify_incoming else None)
    return RotatingContext(files, "devconsul tls", server_context,
                           on_error=lambda exc: log.warning("TLS files changed but cannot be used: %s", exc))


class _AlertingTls(asyncio.sslproto.SSLProtocol):
    """asyncio's TLS protocol, but a refused handshake sends its alert before the close
    (asyncio drops it), as Consul does: a client without a certificate under
    verify_incoming reads "certificate required", not a bare hang-up."""

    def _on_handshake_complete(self, handshake_exc: BaseException | None) -> None:
        if handshake_exc is not None:
            self._process_outgoing()  # type: ignore[attr-defined]  # the alert OpenSSL wrote
        super()._on_handshake_complete(handshake_exc)  # type: ignore[misc]


def tls_factory(inner: Callable[[], asyncio.Protocol], ctx: ssl.SSLContext,
                loop: asyncio.AbstractEventLoop) -> Callable[[], asyncio.Protocol]:
    return lambda: _AlertingTls(loop, inner(), ctx, None, server_side=True)


def _tls_mode(tls: RotatingContext | None) -> str:
    if tls is None:
        return "tls off"
    return "tls on, verify_incoming " + ("on" if tls.files.ca_file else "off")


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
