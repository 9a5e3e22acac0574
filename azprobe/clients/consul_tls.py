"""Consul over HTTPS: the requests session every Consul client of azprobe uses, and the
one-line account of a failed handshake.

The session's HTTPS connections take their SSLContext from a tls.RotatingContext (the
one builder, azprobe/security/tls.py), handed to urllib3 as `ssl_context`: requests'
own verification (its CA bundle, `verify=`, `cert=`) is left out entirely, so the
context alone decides what is trusted and which client certificate is sent. A context
rebuilt after a rotation is a new pool key, so the connections made after it use the
new material; the idle ones of the old context are closed, one in use finishes.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

import requests
import urllib3
from requests.adapters import HTTPAdapter

from azprobe.errors import ConfigError
from azprobe.security import tls

log = logging.getLogger(__name__)

# Go's strconv.ParseBool, which Consul's CLI reads CONSUL_HTTP_SSL_VERIFY and CONSUL_HTTP_SSL with.
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_bool(name: str, value: str) -> bool:
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(name, f"{value[:20]!r} is not a boolean", "use true or false (or 1 or 0)")


class _ContextAdapter(HTTPAdapter):
    def __init__(self, context: tls.RotatingContext) -> None:
        self.context = context
        self._in_use: ssl.SSLContext | None = None
        super().__init__()

    def build_connection_pool_key_attributes(self, request: requests.PreparedRequest, verify: Any,
                                             cert: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
        host_params, _ = super().build_connection_pool_key_attributes(request, False)
        ctx = self.context.current()
        if self._in_use is not None and ctx is not self._in_use:
            self.poolmanager.clear()  # idle connections of the old material; one in use finishes
        self._in_use = ctx
        # urllib3 sets the context's verify_mode from cert_reqs: keep it the context's own.
        pool_kwargs: dict[str, Any] = {"ssl_context": ctx,
                                       "cert_reqs": "CERT_NONE" if ctx.verify_mode == ssl.CERT_NONE else "CERT_REQUIRED"}
        if self.context.files.server_name:
            pool_kwargs["server_hostname"] = self.context.files.server_name  # SNI and the name verified
        return host_params, pool_kwargs

    def cert_verify(self, conn: Any, url: str, verify: Any, cert: Any) -> None:
        """requests would add its CA bundle (and `cert=`) to the pool: the context decides."""
        conn.ca_certs = conn.ca_cert_dir = None


def _rotation_failed(exc: ConfigError) -> None:
    log.warning("consul TLS files changed but cannot be used, keeping the old ones: %s", exc)


def tls_context(files: tls.TlsFiles, field: str) -> tls.RotatingContext:
    """Consul's client context; its ConfigError (a missing file, a key others may read) at start."""
    if not files.verify:
        # The operator turned verification off on purpose (CONSUL_HTTP_SSL_VERIFY=false):
        # urllib3's two-line warning on every request would bury the CLI's output.
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    return tls.RotatingContext(files, field, tls.client_context, on_error=_rotation_failed)


def session(context: tls.RotatingContext | None) -> requests.Session:
    """A requests session; https:// through `context` (None: plain HTTP only)."""
    s = requests.Session()
    if context is not None:
        s.mount("https://", _ContextAdapter(context))
    return s


# cause -> what to set, for the CLI's environment and the config's [consul] table
_FIXES = {
    tls.NO_CLIENT_CERT: "set CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY, or consul.cert_file/key_file",
    tls.CLIENT_CERT_REFUSED: "give a client certificate signed by the CA Consul's verify_incoming trusts, "
                             "valid now (CONSUL_CLIENT_CERT/CONSUL_CLIENT_KEY, or consul.cert_file/key_file)",
    tls.HANDSHAKE_REFUSED: "set CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY, or consul.cert_file/key_file, "
                           "to a certificate Consul's CA signed",
    tls.UNKNOWN_CA: "set CONSUL_CACERT or consul.ca_file to the CA that signed Consul's certificate",
    tls.NAME_MISMATCH: "set CONSUL_TLS_SERVER_NAME or consul.server_name to a name in Consul's certificate "
                       "(e.g. server.dc1.consul)",
    tls.EXPIRED: "renew Consul's certificate, or check this host's clock",
    tls.NOT_TLS: "use Consul's HTTPS port, or an http:// address",
}


# A server that refuses the handshake may hang up before its alert reaches us (a race
# with our request on the wire): under https that is still most likely a refusal.
_TLS_HANG_UP = ("eof occurred in violation of protocol", "unexpected eof")
_HANG_UP = "remote end closed connection without response"  # http:// to an HTTPS port


def describe_failure(exc: BaseException, address: str, what: str) -> str | None:
    """One line for a failed handshake with Consul, its cause and the fix; None when
    `exc` is no TLS failure."""
    failure = tls.tls_failure(exc)
    cause = failure.cause if failure is not None and failure.cause != tls.HANDSHAKE_FAILED else None
    if cause is None:
        texts = tls.exception_texts(exc)
        if not address.startswith("https://"):
            if not any(_HANG_UP in t for t in texts):
                return None
            return (f"Consul at {address} closed the connection without an answer while {what} "
                    f"(if it serves HTTPS, use an https:// address)")
        if not any(w in t for t in texts for w in _TLS_HANG_UP):
            return None
        cause = tls.HANDSHAKE_REFUSED
    verb = "refused our TLS handshake" if cause in (tls.NO_CLIENT_CERT, tls.CLIENT_CERT_REFUSED,
                                                    tls.HANDSHAKE_REFUSED) else "failed TLS"
    return f"Consul at {address} {verb} while {what}: {cause} ({_FIXES[cause]})"
