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

import grpc

from azprobe.errors import ConfigError
from azprobe.security.tls import Rotating, ServerPem, TlsFiles, server_pem

log = logging.getLogger(__name__)


def _configuration(pem: ServerPem) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(pem.key, pem.chain)], root_certificates=pem.client_ca)


def _rotation_failed(exc: ConfigError) -> None:
    log.error("xDS TLS files changed but do not load; serving the previous ones: %s", exc)


def server_credentials(files: TlsFiles, field: str = "xds.tls") -> grpc.ServerCredentials:
    """Credentials that require a client certificate signed by files.ca_file when it is
    set (mutual TLS). A bad file at start raises ConfigError (exit 2)."""
    material = Rotating(files, field, server_pem, on_error=_rotation_failed)
    served = [material.generation]

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        try:
            pem = material.current()
        except Exception:  # grpc's callback thread must get an answer; keep what it has
            log.exception("xDS TLS: checking the files for a rotation failed")
            return None
        if material.generation == served[0]:
            return None
        served[0] = material.generation
        log.warning("xDS TLS: new certificate material in use (generation %d)", served[0])
        return _configuration(pem)

    return grpc.dynamic_ssl_server_credentials(_configuration(material.current()), fetch,
                                               require_client_authentication=files.ca_file is not None)
