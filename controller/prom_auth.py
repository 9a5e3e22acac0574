"""What every query of the Prometheus source carries: the TLS context of an https URL
(its CA: `prometheus.ca_file`, else the system's store) and the Authorization header
from `bearer_token_file` or `basic_auth_file`.

The context comes from the one builder (azprobe/security/tls.py) through a
RotatingContext, the credentials through SecretFile: each is re-read when its file
changes on disk, or on SIGHUP, so the next query after a rotation uses the new material
(aiohttp keys pooled connections by context: an open one finishes with the old). The
credential is in no log line, metric or error; the first read is a ConfigError at start.
"""

from __future__ import annotations

import base64
import logging
from typing import Any

from azprobe.config import read_token_file
from azprobe.controller.config import PrometheusSettings
from azprobe.errors import ConfigError
from azprobe.security import tls
from azprobe.security.secret_file import SecretFile, read_basic_auth_file

log = logging.getLogger(__name__)


def _rotation_failed(exc: ConfigError) -> None:
    log.warning("prometheus TLS files changed but cannot be used, keeping the old ones: %s", exc)


class PromAuth:
    def __init__(self, settings: PrometheusSettings) -> None:
        self._tls = (tls.RotatingContext(tls.TlsFiles(ca_file=settings.ca_file or None), "prometheus",
                                         tls.client_context, on_error=_rotation_failed)
                     if settings.url.startswith("https://") else None)
        self._bearer = (SecretFile(settings.bearer_token_file, "prometheus.bearer_token_file", read_token_file)
                        if settings.bearer_token_file else None)
        self._basic = (SecretFile(settings.basic_auth_file, "prometheus.basic_auth_file", read_basic_auth_file)
                       if settings.basic_auth_file else None)

    def request_kwargs(self) -> dict[str, Any]:
        """aiohttp's `ssl` and `headers` for the next query."""
        kwargs: dict[str, Any] = {}
        if self._tls is not None:
            kwargs["ssl"] = self._tls.current()
        if self._bearer is not None:
            kwargs["headers"] = {"Authorization": f"Bearer {self._bearer.value()}"}
        elif self._basic is not None:
            user, password = self._basic.value()
            token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
            kwargs["headers"] = {"Authorization": f"Basic {token}"}
        return kwargs


def describe(error: BaseException) -> str:
    """A failed query's one line; a failed handshake names its cause and the field to set."""
    failure = tls.tls_failure(error)
    if failure is None or failure.cause == tls.HANDSHAKE_FAILED:
        return str(error) or type(error).__name__
    cause = failure.cause
    fix = {tls.UNKNOWN_CA: "set prometheus.ca_file to the CA that signed its certificate",
           tls.NOT_TLS: "use an http:// URL or Prometheus's HTTPS port"}.get(cause, "check its certificate")
    return f"TLS to Prometheus failed: {cause} ({fix})"
