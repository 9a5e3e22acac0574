"""The one place that builds TLS contexts, for every server and client of azprobe.

Servers (the agent's windows API, the xDS server, the scheduler extender, devconsul) and
clients (the controller's pulls, Consul, the Prometheus source) describe their side with
`TlsFiles` and get an `ssl.SSLContext` from `server_context` / `client_context`. Nothing
else in the tree calls `ssl.create_default_context` or `load_cert_chain`. grpc takes PEM
bytes, not a context: `server_pem` reads a server's files into them after every check
`server_context` makes.

Rotation: `RotatingContext` (and `Rotating`, for any material built from the files, such
as `server_pem`'s) checks its files' identity (inode, size, mtime) at most once
a second and builds a fresh context when one changed; a connection made after the change
uses the new material, one already open finishes with the old. A server gets the fresh
context per handshake through the SNI callback, so its listening socket never changes.

Keys are secrets: a key file goes through `read_secret_file`'s checks (a regular file,
ours or root's, no group/other access) before OpenSSL reads it, and no error message
carries a byte of any PEM file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field as dataclass_field
from typing import Any, Generic, TypeVar

from azprobe.config import Section, nul_in_path, read_secret_file
from azprobe.errors import ConfigError
from azprobe.security import reloadable

MIN_VERSION = ssl.TLSVersion.TLSv1_2
CHECK_EVERY_S = 1.0  # how often a RotatingContext looks at its files
MAX_PEM_BYTES = 1024 * 1024  # a CA bundle is large; anything bigger is the wrong file
T = TypeVar("T")


@dataclass(frozen=True)
class TlsFiles:
    """The PEM files of one side of a TLS connection.

    cert_file/key_file: this side's certificate chain and key (a client sends them only
    when both are set). ca_file: on a server, the CA that must have signed every client's
    certificate (None: no client certificate is asked for); on a client, the CA that must
    have signed the server's (None: the system's trust store). server_name: a client's
    name to verify instead of the address's host. verify=False (clients only) turns off
    the server check entirely, for CONSUL_HTTP_SSL_VERIFY=false labs.
    """

    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None
    server_name: str | None = None
    verify: bool = True

    def paths(self) -> tuple[str, ...]:
        return tuple(p for p in (self.cert_file, self.key_file, self.ca_file) if p)


def _check_pem(path: str, field: str) -> None:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ConfigError(field, f"cannot read {path}: {exc.strerror or exc}",
                          "point it at a readable PEM file") from None
    except ValueError:  # a NUL in the path
        raise nul_in_path(field, path) from None
    if not os.path.isfile(path) or st.st_size > MAX_PEM_BYTES:
        raise ConfigError(field, f"{path} is not a PEM file of at most {MAX_PEM_BYTES} bytes",
                          "point it at a PEM certificate file")


def _load_chain(ctx: ssl.SSLContext, files: TlsFiles, field: str) -> None:
    assert files.cert_file and files.key_file
    _check_pem(files.cert_file, f"{field}.cert_file")
    read_secret_file(files.key_file, f"{field}.key_file")  # refuses a key others may read
    _load_pair(ctx, files, field, files.cert_file, files.key_file)


def _load_pair(ctx: ssl.SSLContext, files: TlsFiles, field: str, cert_path: str, key_path: str) -> None:
    """OpenSSL loads the chain at `cert_path` and the key at `key_path` and checks that
    they fit; its errors name files.cert_file and files.key_file."""
    assert files.cert_file and files.key_file
    try:
        # Without a password callable OpenSSL asks for a pass phrase on the terminal: a
        # rotation to an encrypted key would block the daemon (in an SNI callback, its
        # serving thread) until someone typed one.
        ctx.load_cert_chain(cert_path, key_path, password=lambda: _encrypted(files.key_file, field))
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"{field}.cert_file", f"cannot load {files.cert_file} with key {files.key_file}: "
                          f"{_reason(exc)}", "give a PEM certificate chain and its matching private key") from None


def _encrypted(key_file: str, field: str) -> bytes:
    raise ConfigError(f"{field}.key_file", f"{key_file} is encrypted: azprobe reads no pass phrase",
                      f"give an unencrypted key (openssl pkey -in {key_file} -out KEY), of mode 0600")


def _load_ca(ctx: ssl.SSLContext, path: str, field: str, read_from: str | None = None) -> None:
    """The CA file `path` (read from `read_from` instead when given: a copy of its bytes)."""
    if read_from is None:
        _check_pem(path, f"{field}.ca_file")
    try:
        ctx.load_verify_locations(cafile=read_from or path)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"{field}.ca_file", f"cannot load CA {path}: {_reason(exc)}",
                          "give a PEM file of CA certificates") from None


def _reason(exc: BaseException) -> str:
    """OpenSSL's reason without file contents: ssl.SSLError carries `reason`."""
    reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None)
    return str(reason or type(exc).__name__)


def server_context(files: TlsFiles, field: str) -> ssl.SSLContext:
    """A server's context: its chain, TLS 1.2 or newer, and when files.ca_file is set a
    required client certificate signed by that CA (mutual TLS)."""
    if not (files.cert_file and files.key_file):
        raise ConfigError(field, "a TLS server needs cert_file and key_file", "set both, or leave TLS off")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = MIN_VERSION
    _load_chain(ctx, files, field)
    if files.ca_file:
        _load_ca(ctx, files.ca_file, field)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(files: TlsFiles, field: str) -> ssl.SSLContext:
    """A client's context: the server verified against files.ca_file (or the system's
    store), and its own chain presented when cert_file and key_file are set."""
    if bool(files.cert_file) != bool(files.key_file):
        raise ConfigError(field, "a client certificate needs both cert_file and key_file", "set both or neither")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = MIN_VERSION
    if files.verify:
        if files.ca_file:
            _load_ca(ctx, files.ca_file, field)
        else:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if files.cert_file:
        _load_chain(ctx, files, field)
    return ctx


def identity_client_context(files: TlsFiles, field: str) -> ssl.SSLContext:
    """A client's context for peers addressed by IP whose identity the caller binds
    itself (the controller's pulls: the SAN must name the node the answer claims,
    controller/agent_identity.py): the chain is verified against files.ca_file, the
    host name is not, since no agent certificate names the address it is reached at."""
    ctx = client_context(files, field)
    if files.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


@dataclass(frozen=True)
class ServerPem:
    """A TLS server's material as PEM bytes, for grpc.ssl_server_credentials and its kin.
    client_ca None: no client certificate is asked for. Nothing here is printed."""

    key: bytes = dataclass_field(repr=False)
    chain: bytes = dataclass_field(repr=False)
    client_ca: bytes | None = dataclass_field(repr=False, default=None)


def _read_pem(path: str, field: str) -> bytes:
    _check_pem(path, field)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PEM_BYTES + 1)
    except OSError as exc:
        raise ConfigError(field, f"cannot read {path}: {exc.strerror or exc}",
                          "point it at a readable PEM file") from None
    if len(data) > MAX_PEM_BYTES or b"-----BEGIN " not in data:
        raise ConfigError(field, f"{path} is not a PEM file of at most {MAX_PEM_BYTES} bytes",
                          "point it at a PEM certificate file")
    return data


def server_pem(files: TlsFiles, field: str) -> ServerPem:
    """A server's files as PEM bytes, after every check `server_context` makes (the key
    file through read_secret_file, the sizes, and OpenSSL's word that the key fits the
    chain and the CA loads), so a bad file fails here, at start, and not per handshake.

    The checks run on the very bytes returned: files replaced while they are read (a
    rotation renames the certificate and the key one after the other) would otherwise
    pass the check as one pair and be returned as another, or torn."""
    if not (files.cert_file and files.key_file):
        raise ConfigError(field, "a TLS server needs cert_file and key_file", "set both, or leave TLS off")
    chain = _read_pem(files.cert_file, f"{field}.cert_file")
    key = read_secret_file(files.key_file, f"{field}.key_file")
    client_ca = _read_pem(files.ca_file, f"{field}.ca_file") if files.ca_file else None
    pem = ServerPem(key=key, chain=chain, client_ca=client_ca)
    _check_server_pem(pem, files, field)
    return pem


def _check_server_pem(pem: ServerPem, files: TlsFiles, field: str) -> None:
    """OpenSSL's checks of server_context on `pem`, read from in-memory files (memfd):
    OpenSSL loads only from paths, and the key must not be copied to a disk."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = MIN_VERSION
    with _memory_file(pem.chain, f"{field}.cert_file") as chain_path, \
            _memory_file(pem.key, f"{field}.key_file") as key_path:
        _load_pair(ctx, files, field, chain_path, key_path)
    if pem.client_ca is not None and files.ca_file:
        with _memory_file(pem.client_ca, f"{field}.ca_file") as ca_path:
            _load_ca(ctx, files.ca_file, field, read_from=ca_path)


@contextlib.contextmanager
def _memory_file(data: bytes, field: str) -> Iterator[str]:
    """A path that reads `data`, for as long as the block runs."""
    try:
        fd = os.memfd_create("azprobe-tls", os.MFD_CLOEXEC)
    except OSError as exc:
        raise ConfigError(field, f"cannot check the file in memory: {exc.strerror or exc}",
                          "raise the process's open-file limit") from None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _identity(paths: tuple[str, ...]) -> tuple[tuple[int, int, int], ...]:
    out = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append((0, 0, 0))
    return tuple(out)


class Rotating(Generic[T]):
    """Material built from TLS files, rebuilt when they change on disk (or on `reload()`,
    for SIGHUP); `generation` counts the builds in use.

    A rebuild that fails (a half-written file, a key that does not match) keeps the
    current material and reports the error through `on_error` once per change, so a
    rotation done in two steps never takes the service down between them."""

    def __init__(self, files: TlsFiles, field: str, build: Callable[[TlsFiles, str], T],
                 on_error: Callable[[ConfigError], None] | None = None) -> None:
        self.files = files
        self.field = field
        self._build = build
        self._on_error = on_error
        self._lock = threading.Lock()
        self._seen = _identity(files.paths())
        self._checked = time.monotonic()
        # One attribute, replaced whole: a reader on another thread never pairs one
        # build's generation with another's material.
        self._state: tuple[int, T] = (1, build(files, field))  # at start an error is fatal: raise it
        reloadable.register(self)  # SIGHUP rebuilds it as well as a change on disk

    @property
    def generation(self) -> int:
        return self._state[0]

    def current(self) -> T:
        return self.versioned()[1]

    def versioned(self) -> tuple[int, T]:
        """(generation, material) of one build, after checking the files when due."""
        now = time.monotonic()
        if now - self._checked >= CHECK_EVERY_S:
            self._checked = now
            if _identity(self.files.paths()) != self._seen:
                self.reload()
        return self._state

    def reload(self) -> bool:
        """Rebuild now; True when the new material is in use."""
        with self._lock:
            seen = _identity(self.files.paths())
            try:
                value = self._build(self.files, self.field)
            except ConfigError as exc:
                if seen != self._seen and self._on_error is not None:
                    self._on_error(exc)
                self._seen = seen
                return False
            self._state, self._seen = (self._state[0] + 1, value), seen
            return True


class RotatingContext(Rotating[ssl.SSLContext]):
    """An SSLContext that follows its files (Rotating), and a listening context that
    hands every handshake the current one."""

    def serving_context(self) -> ssl.SSLContext:
        """A server's listening context that hands every handshake the current material
        (through the SNI callback, which runs before the certificate is chosen)."""
        front = self._build(self.files, self.field)

        def pick(sock: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: ssl.SSLContext) -> None:
            sock.context = self.current()

        front.sni_callback = pick  # type: ignore[assignment]
        return front


def peer_names(cert: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The DNS and URI subject alternative names of a verified peer certificate
    (`SSLSocket.getpeercert()`), in certificate order: the identities a peer may claim."""
    if not cert:
        return ()
    return tuple(value for kind, value in cert.get("subjectAltName", ()) if kind in ("DNS", "URI"))


def parse_tls_files(table: Mapping[str, Any] | Section, field: str, *, server: bool,
                    extra: frozenset[str] = frozenset()) -> TlsFiles:
    """A `[... .tls]` config table: cert_file, key_file, ca_file, and for clients
    server_name and verify. Unknown keys are refused by name, except `extra` (keys of
    the table its caller reads itself). Read through a Section (a caller's Section is
    marked read key by key), so docs/contracts.md's config reference check sees these
    keys as the loader's."""
    allowed = {"cert_file", "key_file", "ca_file"} | (set() if server else {"server_name", "verify"})
    if isinstance(table, Section):
        for key in sorted(allowed):
            table.has(key)
        table = table.data
    section = Section(table, field)
    for key in section.data:
        if key in extra:
            continue
        if key not in allowed:
            raise ConfigError(f"{field}.{key}", "unknown key", f"use one of {', '.join(sorted(allowed))}")
    values: dict[str, Any] = {}
    for key in sorted(allowed - {"verify"}):
        value = section._get(key, None)
        if value is not None:
            if not isinstance(value, str) or not value or len(value) > 4096:
                raise ConfigError(f"{field}.{key}", "must be a non-empty path or name", "quote it as a string")
            values[key] = value
    if "verify" in allowed and (verify := section._get("verify", None)) is not None:
        if not isinstance(verify, bool):
            raise ConfigError(f"{field}.verify", "must be true or false")
        values["verify"] = verify
    files = TlsFiles(**values)
    if server and not (files.cert_file and files.key_file):
        raise ConfigError(field, "a TLS server needs cert_file and key_file", "set both, or remove the table")
    return files


# --- why a handshake failed ---------------------------------------------------------
# The causes `tls_failure` tells apart; callers add the fix in their own terms
# (environment variables, config fields).
NO_CLIENT_CERT = "no client certificate"
CLIENT_CERT_REFUSED = "our client certificate was refused"
HANDSHAKE_REFUSED = "the handshake was refused (a client certificate missing or not accepted)"
UNKNOWN_CA = "its certificate is not signed by a CA we trust"
NAME_MISMATCH = "its certificate does not name the host we asked for"
EXPIRED = "its certificate has expired or is not yet valid"
NOT_TLS = "it does not speak TLS on this port"
HANDSHAKE_FAILED = "the TLS handshake failed"  # an ssl.SSLError none of the words above name

# OpenSSL's words for each cause (lowercased), first match wins: the alerts a server
# sends about our certificate come before the client's own verdicts on the server's.
_CAUSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (NO_CLIENT_CERT, ("alert certificate required", "peer did not return a certificate")),
    (CLIENT_CERT_REFUSED, ("alert unknown ca", "alert bad certificate", "alert certificate expired",
                           "alert certificate unknown", "alert certificate revoked", "alert access denied",
                           "alert unsupported certificate")),
    (HANDSHAKE_REFUSED, ("alert handshake failure",)),
    (NAME_MISMATCH, ("hostname mismatch", "ip address mismatch", "doesn't match")),
    (EXPIRED, ("certificate has expired", "certificate is not yet valid")),
    (UNKNOWN_CA, ("unable to get local issuer certificate", "self-signed certificate", "self signed certificate",
                  "unable to verify the first certificate", "certificate verify failed")),
    (NOT_TLS, ("wrong version number", "record layer failure", "packet length", "unknown protocol",
               "http request")),
)

# The bounded words of a cause (metric labels).
TLS_FAILURE_REASONS = ("unknown_ca", "expired", "client_certificate_refused", "not_tls", "other")
_REASON_OF_CAUSE = {NO_CLIENT_CERT: "client_certificate_refused", CLIENT_CERT_REFUSED: "client_certificate_refused",
                    HANDSHAKE_REFUSED: "client_certificate_refused", UNKNOWN_CA: "unknown_ca", EXPIRED: "expired",
                    NOT_TLS: "not_tls"}


def exception_texts(exc: BaseException | None, depth: int = 0) -> list[str]:
    """The messages of an exception and of the ones it wraps (requests wraps urllib3's,
    which wraps ssl's; aiohttp keeps ssl's as `os_error`)."""
    return [str(e).lower() for e in _chain(exc, depth)]


def _chain(exc: BaseException | None, depth: int = 0) -> list[BaseException]:
    if exc is None or depth > 8:
        return []
    out = [exc]
    inner = [exc.__cause__, exc.__context__, getattr(exc, "reason", None), getattr(exc, "os_error", None)]
    inner += [a for a in getattr(exc, "args", ()) if isinstance(a, BaseException)]
    for e in inner:
        if isinstance(e, BaseException) and e is not exc:
            out += _chain(e, depth + 1)
    return out


@dataclass(frozen=True)
class TlsFailure:
    """Why a TLS handshake failed: `cause` (one of the constants above), `reason` (its
    bounded label, TLS_FAILURE_REASONS), `detail` (OpenSSL's words, never a PEM byte) and
    `verify` (True when this side's check of the peer's certificate failed)."""

    cause: str
    reason: str
    detail: str
    verify: bool = False

    @property
    def line(self) -> str:
        """The one-line cause for logs and a pull's error."""
        if self.verify:
            suffix = " (not signed by the configured CA)" if self.reason == "unknown_ca" else ""
            return f"certificate verify failed: {self.detail}{suffix}"
        if self.reason == "client_certificate_refused":
            return f"the peer refuses this side's client certificate ({self.detail})"
        if self.reason == "not_tls":
            return f"the peer does not speak TLS ({self.detail})"
        return f"TLS handshake failed ({self.detail})"


def tls_failure(exc: BaseException) -> TlsFailure | None:
    """Why `exc` (or an exception it wraps) is a failed TLS handshake; None when it is
    not one. A verify error is told by its code, anything else by OpenSSL's words; an
    ssl.SSLError whose words name no cause is HANDSHAKE_FAILED."""
    chain = _chain(exc)
    # (aiohttp's certificate error subclasses ssl's without its attributes: it wraps one)
    verify = next((e for e in chain if isinstance(e, ssl.SSLCertVerificationError) and hasattr(e, "verify_code")),
                  None)
    text = " ".join(str(e).lower() for e in chain).replace("_", " ")
    cause = next((c for c, words in _CAUSES if any(w in text for w in words)), None)
    if verify is not None:
        detail = verify.verify_message or _reason(verify)
        if verify.verify_code == X509_V_ERR_CERT_HAS_EXPIRED:
            return TlsFailure(EXPIRED, "expired", detail, verify=True)
        if verify.verify_code in _UNKNOWN_ISSUER:
            return TlsFailure(UNKNOWN_CA, "unknown_ca", detail, verify=True)
        return TlsFailure(cause or UNKNOWN_CA, "other", detail, verify=True)
    ssl_error = next((e for e in chain if isinstance(e, ssl.SSLError)), None)
    if cause is None:
        return None if ssl_error is None else TlsFailure(HANDSHAKE_FAILED, "other", _reason(ssl_error))
    return TlsFailure(cause, _REASON_OF_CAUSE.get(cause, "other"), _reason(ssl_error or exc))


def peer_fingerprint(der: bytes | None) -> str:
    """The SHA-256 of a peer certificate (DER): one value per certificate, whatever names it carries."""
    return hashlib.sha256(der).hexdigest() if der else ""


X509_V_ERR_CERT_HAS_EXPIRED = 10
_UNKNOWN_ISSUER = (2, 18, 19, 20, 21)  # unable to get issuer; self-signed (in chain); no local issuer; leaf unverifiable
