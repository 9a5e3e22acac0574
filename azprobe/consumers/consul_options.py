"""The Consul TLS flags of every CLI command that reads Consul, named as Consul's CLI
names them; each beats its environment variable (CONSUL_CACERT, CONSUL_CLIENT_CERT,
CONSUL_CLIENT_KEY, CONSUL_TLS_SERVER_NAME), which beats the default. The command hands
them on as keyword arguments of ConsulSettings.from_env."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

F = TypeVar("F", bound=Callable[..., object])

_OPTIONS = (
    click.option("--ca-file", "ca_file", metavar="FILE", default=None,
                 help="CA that signed Consul's HTTPS certificate (default: $CONSUL_CACERT, else the system's)."),
    click.option("--client-cert", "cert_file", metavar="FILE", default=None,
                 help="Client certificate for Consul's verify_incoming (default: $CONSUL_CLIENT_CERT)."),
    click.option("--client-key", "key_file", metavar="FILE", default=None,
                 help="Its key, mode 0600 (default: $CONSUL_CLIENT_KEY)."),
    click.option("--tls-server-name", "server_name", metavar="NAME", default=None,
                 help="Name to verify in Consul's certificate (default: $CONSUL_TLS_SERVER_NAME, else the host)."),
)


def consul_tls_options(command: F) -> F:
    for option in reversed(_OPTIONS):
        command = option(command)
    return command
