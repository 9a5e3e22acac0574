"""TLS for the xDS gRPC listener: grpc's server credentials from `[xds.tls]`.

grpc takes PEM bytes, not an ssl.SSLContext, so the material comes from
azprobe.security.tls.server_pem (the one TLS builder's checks) and follows its files with
azprobe.security.tls.Rotating. grpc asks the fetcher for a new configuration before each
new connection's handshake; the fetcher answers None (keep the current one) unless the
files changed, so a rotated certificate or client CA takes effect on the next connection
and the open ones finish with the old material. A rotation that fails to load keeps the
current material and is logged once.
"""

from __future__ import annotations

import logging
import threading

import grpc

from azprobe.errors import ConfigError
from azprobe.security.tls import Rotating, ServerPem, TlsFiles, server_pem

log = logging.getLogger(__name__)


def _configuration(pem: ServerPem) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(pem.key, pem.chain)], root_certificates=pem.client_ca)


def _rotation_failed(exc: ConfigError) -> None:
    log.error("xDS TLS files changed but do not load; serving the previous ones: %s", exc)


class _CertificateFetcher:
    """grpc's certificate configuration fetcher, called from grpc's threads: the material
    of a generation newer than the one handed to grpc, else None (keep it)."""

    def __init__(self, material: Rotating[ServerPem]) -> None:
        self.material = material
        self._lock = threading.Lock()
        self._served, pem = material.versioned()
        self.initial = _configuration(pem)  # grpc's configuration until the first rotation

    def newer(self) -> ServerPem | None:
        try:
            generation, pem = self.material.versioned()
        except Exception:  # grpc's callback thread must get an answer; keep what it has
            log.exception("xDS TLS: checking the files for a rotation failed")
            return None
        # `generation` is that of `pem` itself (one build): a rotation landing while this
        # fetch runs is never recorded as served with the older material, which would
        # keep grpc on it for good. Only forward: a slower fetch cannot record an older one.
        with self._lock:
            if generation <= self._served:
                return None
            self._served = generation
        log.warning("xDS TLS: new certificate material in use (generation %d)", generation)
        return pem

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        pem = self.newer()
        return None if pem is None else _configuration(pem)


def server_credentials(files: TlsFiles, field: str = "xds.tls") -> grpc.ServerCredentials:
    """Credentials that require a client certificate signed by files.ca_file when it is
    set (mutual TLS). A bad file at start raises ConfigError (exit 2)."""
    material = Rotating(files, field, server_pem, on_error=_rotation_failed)
    fetcher = _CertificateFetcher(material)
    return grpc.dynamic_ssl_server_credentials(fetcher.initial, fetcher,
                                               require_client_authentication=files.ca_file is not None)
