"""The Consul client azprobe uses everywhere: settings, a py-consul client, fenced
transactions and a blocking-watch loop that follows Consul's documented rules.

The same code talks to a real Consul cluster in production and to `azprobe devconsul`
in development and tests. The ACL token never appears in logs, reprs or errors.

Blocking-query rules (developer.hashicorp.com/consul/api-docs/features/blocking,
"Implementation details"), each in a small pure function below:
- a returned index lower than the previous one resets the index to 0 (a fresh,
  non-blocking read), so the watch cannot stall on an index the server no longer has;
- a returned index of 0 is a server bug that would make every call return at once:
  use 1 instead, so the next call still blocks;
- successive calls are spaced by a minimum interval (a write storm cannot become a
  request storm);
- errors back off exponentially with jitter, so many watchers do not retry in lockstep;
- a 403 is an error, never "no data"; so is a recursive 404 where the caller knows the
  prefix must hold keys (ACLs filter recursive results silently). A 404 on a single key
  means the key is absent.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import random
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import consul
import consul.base
import consul.std
import requests
import urllib3
import urllib3.connection

from azprobe.clients import consul_tls
from azprobe.clients.consul_tls import parse_bool
from azprobe.config import Section, read_token_file
from azprobe.contracts import bounded_json, kv
from azprobe.contracts.window import is_decimal
from azprobe.errors import AzprobeError, ConfigError
from azprobe.security import secret_file
from azprobe.security.tls import TlsFiles, client_context

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "http://127.0.0.1:8500"
DEFAULT_PREFIX = kv.DEFAULT_PREFIX
MAX_TXN_OPS = 128  # Consul's limit per transaction
# The largest answer read: one KV value (base64 grows it by a third) with its metadata,
# with room for a recursive read of the few small switches under control/.
MAX_ANSWER_BYTES = 8 * kv.MAX_VALUE_BYTES
ADDRESS_HELP = "pass --consul URL or set CONSUL_HTTP_ADDR"
TOKEN_HELP = "set CONSUL_HTTP_TOKEN, CONSUL_HTTP_TOKEN_FILE or consul.token_file"
TOKEN_FILE_FIELD = "consul.token_file"


# --- errors -------------------------------------------------------------------------

class ConsulError(AzprobeError):
    """Consul could not answer the way we need; the message says what to fix."""


class ConsulUnreachable(ConsulError):
    """No HTTP answer at all: wrong address, server down, TLS failure."""


class ConsulPermissionDenied(ConsulError):
    """403: the token (or its absence) does not allow this read or write."""


class ConsulEmptyPrefix(ConsulError):
    """A recursive read found nothing where keys must exist (possibly ACL-filtered)."""


class TxnConflict(ConsulError):
    """409 from /v1/txn: the transaction rolled back. `errors` is Consul's Errors list
    ([{"OpIndex": i, "What": "..."}]), e.g. a failed check-session when fenced."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        self.errors = errors
        whats = "; ".join(f"op {e.get('OpIndex')}: {e.get('What')}" for e in errors) or "no details"
        super().__init__(f"consul transaction rolled back ({whats})")


# --- settings -----------------------------------------------------------------------

@dataclass(frozen=True)
class ConsulSettings:
    """Where Consul is and how to authenticate. `token` is excluded from repr.

    The ACL token: `token_file` (a path) beats `token` (a literal, e.g. CONSUL_HTTP_TOKEN).
    The file is re-read when it changes, or on SIGHUP (secret_file.SecretFile, one per
    path in the process): `current_token()` is what the next request sends.

    TLS (an https:// address): `ca_file` verifies Consul's certificate (None: the
    system's store), `cert_file`/`key_file` are our client certificate (Consul's
    verify_incoming), `server_name` the name verified instead of the address's host,
    `verify=False` no verification at all (CONSUL_HTTP_SSL_VERIFY=false)."""

    address: str = DEFAULT_ADDRESS
    token: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    prefix: str = DEFAULT_PREFIX
    timeout_s: float = 10.0
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None
    verify: bool = True
    token_file: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", normalize_address(self.address))
        if self.prefix and not self.prefix.endswith("/"):
            object.__setattr__(self, "prefix", self.prefix + "/")
        if self.prefix.startswith("/"):
            raise ConfigError("consul.prefix", f"{self.prefix!r} starts with '/'", "use e.g. azprobe/v1/")

    def __repr__(self) -> str:
        token = "<file>" if self.token_file else "<set>" if self.token else "<none>"
        tls = (f", cert_file={self.cert_file!r}, server_name={self.server_name!r}, verify={self.verify}"
               if self.tls else "")
        return (f"ConsulSettings(address={self.address!r}, token={token}, ca_file={self.ca_file!r}{tls}, "
                f"prefix={self.prefix!r})")

    __str__ = __repr__

    def current_token(self) -> str | None:
        """The token the next request carries: the token file's last good content, else `token`."""
        if self.token_file:
            return secret_file.shared(self.token_file, TOKEN_FILE_FIELD, read_token_file).value()
        return self.token

    def key(self, name: str) -> str:
        """Full KV key for a name under the prefix, e.g. key("weights")."""
        return self.prefix + name.lstrip("/")

    @property
    def parts(self) -> tuple[str, str, int]:
        """(scheme, host, port) of the address."""
        url = urllib.parse.urlsplit(self.address)
        return url.scheme, url.hostname or "127.0.0.1", url.port or (443 if url.scheme == "https" else 8500)

    @property
    def tls(self) -> bool:
        return self.address.startswith("https://")

    def tls_files(self) -> TlsFiles:
        return TlsFiles(cert_file=self.cert_file, key_file=self.key_file, ca_file=self.ca_file,
                        server_name=self.server_name, verify=self.verify)

    @classmethod
    def from_env(cls, address: str | None = None, prefix: str | None = None,
                 token_file: str | None = None, ca_file: str | None = None, cert_file: str | None = None,
                 key_file: str | None = None, server_name: str | None = None) -> "ConsulSettings":
        """Consul's CLI precedence: explicit arguments (CLI flags) win; then CONSUL_HTTP_ADDR,
        CONSUL_HTTP_TOKEN_FILE, CONSUL_HTTP_TOKEN, CONSUL_CACERT, CONSUL_CLIENT_CERT,
        CONSUL_CLIENT_KEY, CONSUL_TLS_SERVER_NAME, CONSUL_HTTP_SSL_VERIFY; then the defaults.
        The TLS files are checked now (ConfigError) when the address is https."""
        flags = {"ca_file": ca_file, "cert_file": cert_file, "key_file": key_file, "server_name": server_name}
        settings = cls(address=_env_address(address), **resolve_token(token_file, TOKEN_FILE_FIELD),
                       prefix=DEFAULT_PREFIX if prefix is None else prefix, **_env_tls(flags, None))
        check_tls(settings, "consul")
        return settings

    @classmethod
    def from_section(cls, section: Section) -> "ConsulSettings":
        """The [consul] table of a config file (docs/contracts.md "Controller config"); a value
        set there counts as explicit, beating the environment, which beats the defaults.
        Unknown keys are rejected."""
        address = section.string("address", "")
        token_file = section.string("token_file", "")
        explicit = {key: section.string(key, "") or None for key in ("ca_file", "cert_file", "key_file",
                                                                     "server_name")}
        verify = section.boolean("verify", True) if section.has("verify") else None
        prefix = section.string("prefix", DEFAULT_PREFIX)
        section.reject_unknown()
        resolved = _env_address(address or None)
        try:
            normalize_address(resolved)
        except ConfigError as exc:
            raise ConfigError(section.field("address"), exc.problem, exc.fix) from None
        settings = cls(address=resolved, **resolve_token(token_file or None, section.field("token_file")),
                       prefix=prefix, **_env_tls(explicit, verify))
        check_tls(settings, section.name or "consul")
        return settings


def _env_address(explicit: str | None) -> str:
    """The address, and CONSUL_HTTP_SSL=true's https (which, as in Consul's CLI, never
    reverts to http)."""
    address = explicit or os.environ.get("CONSUL_HTTP_ADDR") or DEFAULT_ADDRESS
    ssl_env = os.environ.get("CONSUL_HTTP_SSL")
    if ssl_env and parse_bool("CONSUL_HTTP_SSL", ssl_env):
        address = "https://" + address.split("://", 1)[-1]
    return address


_TLS_ENV = {"ca_file": "CONSUL_CACERT", "cert_file": "CONSUL_CLIENT_CERT", "key_file": "CONSUL_CLIENT_KEY",
            "server_name": "CONSUL_TLS_SERVER_NAME"}


def _env_tls(explicit: Mapping[str, str | None], verify: bool | None) -> dict[str, Any]:
    values: dict[str, Any] = {key: explicit.get(key) or os.environ.get(env) or None for key, env in _TLS_ENV.items()}
    if verify is None:
        env = os.environ.get("CONSUL_HTTP_SSL_VERIFY")
        verify = parse_bool("CONSUL_HTTP_SSL_VERIFY", env) if env else True
    values["verify"] = verify
    return values


def check_tls(settings: ConsulSettings, field_name: str) -> None:
    """Build the client context once, so a missing file or a key others may read is a
    ConfigError at start (exit 2), never a failure at the first request."""
    if settings.tls:
        client_context(settings.tls_files(), field_name)


def normalize_address(address: str) -> str:
    """"127.0.0.1:8500" -> "http://127.0.0.1:8500"; validates scheme, host and port (not 0)."""
    text = address.strip()
    if "://" not in text:
        text = "http://" + text
    url = urllib.parse.urlsplit(text)
    if url.scheme not in ("http", "https"):
        raise ConfigError("consul address", f"{address!r}: scheme must be http or https", ADDRESS_HELP)
    try:
        port = url.port
    except ValueError:
        raise ConfigError("consul address", f"{address!r}: bad port", "for example http://127.0.0.1:8500") from None
    if not url.hostname:
        raise ConfigError("consul address", f"{address!r}: no host", "for example http://127.0.0.1:8500")
    if port == 0:  # urlsplit gives 0 for ":0", which "or default" would turn into 8500
        raise ConfigError("consul address", f"{address!r}: port 0", "give Consul's real port, e.g. :8500")
    host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    return f"{url.scheme}://{host}:{port or (443 if url.scheme == 'https' else 8500)}"


def resolve_token(token_file: str | None, field_name: str) -> dict[str, str | None]:
    """{"token": ..., "token_file": ...} by Consul's precedence: a token file beats a token;
    an explicit file beats the env. The file is read strictly now (a loose mode or an empty
    file is a ConfigError at start, exit 2); from then on the process's one SecretFile for
    the path re-reads it, keeping the last good token when a re-read fails."""
    path = token_file or os.environ.get("CONSUL_HTTP_TOKEN_FILE") or None
    if path:
        label = field_name if token_file else "CONSUL_HTTP_TOKEN_FILE"
        read_token_file(path, label)
        secret_file.shared(path, label, read_token_file)
        return {"token": None, "token_file": path}
    return {"token": os.environ.get("CONSUL_HTTP_TOKEN") or None, "token_file": None}


# --- client -------------------------------------------------------------------------

class _BoundedHTTPClient(consul.std.HTTPClient):
    """py-consul's HTTP client, with every answer read under two bounds before py-consul
    sees it: at most MAX_ANSWER_BYTES (refused from Content-Length when it says more,
    else once one byte more has arrived), and complete within the request's timeout as
    py-consul computes it (settings.timeout_s, plus a blocking query's wait and jitter).
    requests alone checks neither: it reads the whole body into memory, and its timeout
    applies to each socket read, so a server dripping bytes holds a read forever. A JSON
    answer nested too deeply is refused too, before py-consul's own json.loads reads it.
    Refusals are ConsulExceptions, so callers see a ConsulError like any failed read."""

    def get(self, callback: Callable[[consul.base.Response], Any], path: str, params: Any = None,
            headers: dict[str, str] | None = None, raw: bool = False) -> Any:
        return callback(self._send("GET", path, params, raw, headers=headers))

    def put(self, callback: Callable[[consul.base.Response], Any], path: str, params: Any = None,
            data: str | bytes = "", headers: dict[str, str] | None = None) -> Any:
        return callback(self._send("PUT", path, params, False, headers=headers, data=data))

    def delete(self, callback: Callable[[consul.base.Response], Any], path: str, params: Any = None,
               data: str | bytes = "", headers: dict[str, str] | None = None) -> Any:
        return callback(self._send("DELETE", path, params, False, headers=headers, data=data))

    def post(self, callback: Callable[[consul.base.Response], Any], path: str, params: Any = None,
             data: str = "", headers: dict[str, str] | None = None) -> Any:
        return callback(self._send("POST", path, params, False, headers=headers, data=data))

    def _send(self, method: str, path: str, params: Any, raw: bool, **kwargs: Any) -> consul.base.Response:
        limit_s = self.timeout(params)
        deadline = None if limit_s is None else time.monotonic() + limit_s
        # stream=True: requests returns once the headers are in, leaving the body to
        # _read_body; verify, cert and the session (its TLS adapter) are py-consul's own.
        # The head is read inside urllib3, out of our reach: its connection
        # (_HeadBoundedConnection) finds the deadline here, on this thread.
        _answer_bound.value = None if deadline is None else (deadline, limit_s)
        try:
            response = self.session.request(method, self.uri(path, params), verify=self.verify, cert=self.cert,
                                            timeout=limit_s, stream=True, **kwargs)
        finally:
            _answer_bound.value = None
        try:
            _check_length(response)
            response._content = _read_body(response, deadline, limit_s)
            response._content_consumed = True
        finally:
            # After a refusal the rest of the body is unread: close() drops the connection
            # instead of handing it back to the pool half-read.
            response.close()
        return self.response(response, raw)

    def response(self, response: requests.Response, raw: bool = False) -> consul.base.Response:
        if not raw:
            try:
                bounded_json.check(response.content, max_bytes=MAX_ANSWER_BYTES, what="Consul's answer")
            except bounded_json.JsonRefused as exc:
                raise consul.ConsulException(str(exc)) from None
        return super().response(response, raw)


READ_CHUNK_BYTES = 64 << 10


def _check_length(response: requests.Response) -> None:
    """Refuse before reading when the answer announces more than MAX_ANSWER_BYTES."""
    announced = response.headers.get("Content-Length", "").strip()
    if is_decimal(announced) and int(announced) > MAX_ANSWER_BYTES:
        raise consul.ConsulException(f"Consul's answer of {int(announced)} bytes (its Content-Length) "
                                     f"exceeds the limit of {MAX_ANSWER_BYTES}")


def _read_body(response: requests.Response, deadline: float | None, limit_s: float | None) -> bytes:
    """The decoded body: at most MAX_ANSWER_BYTES + 1 bytes read, complete by `deadline`."""
    body = bytearray()
    while True:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise _late(limit_s)
        chunk = _read_some(response, min(READ_CHUNK_BYTES, MAX_ANSWER_BYTES + 1 - len(body)), remaining, limit_s)
        if not chunk:
            return bytes(body)
        body += chunk
        if len(body) > MAX_ANSWER_BYTES:
            raise consul.ConsulException(f"Consul's answer exceeds the limit of {MAX_ANSWER_BYTES} bytes")


def _read_some(response: requests.Response, amt: int, remaining: float | None,
               limit_s: float | None) -> bytes:
    """One socket read's worth (read1: a plain read waits for all `amt` bytes, which a
    drip never completes), with the socket's timeout cut to the time left, so a server
    that stalls near the deadline cannot hold the read a whole timeout past it."""
    shortened = remaining is not None and limit_s is not None and remaining < limit_s
    if shortened:
        _set_socket_timeout(response, remaining)
    raw = response.raw
    try:
        if hasattr(raw, "read1"):
            return raw.read1(amt, decode_content=True)
        return raw.read(amt, decode_content=True)  # urllib3 1.x: no read1
    except urllib3.exceptions.ReadTimeoutError as exc:
        if shortened:
            raise _late(limit_s) from None
        raise requests.exceptions.ConnectionError(exc) from None  # as requests' own body read maps it
    except urllib3.exceptions.SSLError as exc:
        raise requests.exceptions.SSLError(exc) from None
    except urllib3.exceptions.DecodeError as exc:
        raise requests.exceptions.ContentDecodingError(exc) from None
    except urllib3.exceptions.ProtocolError as exc:
        raise requests.exceptions.ChunkedEncodingError(exc) from None


def _set_socket_timeout(response: requests.Response, seconds: float | None) -> None:
    """Best effort: urllib3 keeps a streamed answer's connection as `_connection`; when it
    is not there the read is still bounded, by one more socket timeout."""
    sock = getattr(getattr(response.raw, "_connection", None), "sock", None)
    if sock is not None:
        try:
            sock.settimeout(seconds)
        except OSError:
            pass


def _late(limit_s: float | None) -> consul.ConsulException:
    limit = "its time limit" if limit_s is None else f"{limit_s:g} s (the read's time limit)"
    return consul.ConsulException(f"Consul's answer was not complete within {limit}")


# (deadline, limit_s) of the request this thread is sending, for _HeadBoundedConnection.
_answer_bound = threading.local()


class _HeadDeadline:
    """Shuts a socket down at a deadline, unless stopped first. A drip of header bytes
    resets the socket timeout at every read, so only a clock outside the reads can end
    the head at the request's deadline; shutdown, unlike close, wakes a read blocked on
    the socket in another thread, with TLS too (the base class's shutdown leaves the
    TLS object alone, so the reader just sees the end of the stream)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self._done = False
        self.fired = False
        self._timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = self.fired = True
            try:
                socket.socket.shutdown(self._sock, socket.SHUT_RDWR)
            except OSError:
                pass  # already closed: the read it would end is over

    def stop(self) -> bool:
        """Disarm; True when it fired (the socket is shut: nothing read on it is usable)."""
        self._timer.cancel()
        with self._lock:
            self._done = True
            return self.fired


class _HeadBoundedConnection:
    """A urllib3 connection whose response head must be complete by the deadline of the
    request being sent on this thread (_answer_bound), like the body (_read_body); late,
    it fails with the same ConsulException. Without a deadline (a request not sent by
    _BoundedHTTPClient) it is urllib3's own."""

    sock: socket.socket | None

    def getresponse(self) -> Any:
        bound = getattr(_answer_bound, "value", None)
        if bound is None or self.sock is None:
            return super().getresponse()  # type: ignore[misc]
        deadline, limit_s = bound
        head = _HeadDeadline(self.sock, deadline)
        try:
            response = super().getresponse()  # type: ignore[misc]
        except Exception:
            if head.stop():
                raise _late(limit_s) from None
            raise
        # A shutdown just as the head ended can still look like a complete head (an end
        # of stream ends the headers too): its socket is gone either way.
        if head.stop():
            raise _late(limit_s)
        return response


class _HeadBoundedHTTPConnection(_HeadBoundedConnection, urllib3.connection.HTTPConnection):
    pass


class _HeadBoundedHTTPSConnection(_HeadBoundedConnection, urllib3.connection.HTTPSConnection):
    pass


class _HeadBoundedHTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _HeadBoundedHTTPConnection


class _HeadBoundedHTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _HeadBoundedHTTPSConnection


def _bound_heads(session: requests.Session) -> requests.Session:
    """Every pool the session's adapters make (plain and TLS alike) uses the connections above."""
    for adapter in session.adapters.values():
        manager = getattr(adapter, "poolmanager", None)
        if manager is not None:
            manager.pool_classes_by_scheme = {"http": _HeadBoundedHTTPPool, "https": _HeadBoundedHTTPSPool}
    return session


class _BoundedConsul(consul.Consul):
    """Its `token` is asked of the settings on every request (py-consul reads it for each
    call's header), so a rotated token file is sent from the next request on."""

    settings: ConsulSettings | None = None

    @property  # type: ignore[override]
    def token(self) -> str | None:
        return self.settings.current_token() if self.settings is not None else self._token

    @token.setter
    def token(self, value: str | None) -> None:
        # py-consul's own __init__ sets CONSUL_HTTP_TOKEN over an explicit token; once the
        # settings are attached they decide, by Consul's precedence (resolve_token).
        self._token = value

    def http_connect(self, host: str, port: int, scheme: str, verify: bool | str = True,
                     cert: Any = None) -> consul.std.HTTPClient:
        return _BoundedHTTPClient(host, port, scheme, verify, cert, connections_timeout=self.connections_timeout)


def http_session(settings: ConsulSettings) -> requests.Session:
    """The requests session for Consul at `settings.address`: every Consul client of
    azprobe (py-consul's, the doctor's) goes through it, so https:// always means the
    settings' TLS files, through the one context builder (consul_tls)."""
    context = consul_tls.tls_context(settings.tls_files(), "consul") if settings.tls else None
    return _bound_heads(consul_tls.session(context))


def make_client(settings: ConsulSettings) -> consul.Consul:
    """A py-consul client for the settings; its token is the settings' current one at
    each request (py-consul's CONSUL_HTTP_TOKEN override does not apply)."""
    scheme, host, port = settings.parts
    client = _BoundedConsul(host=host, port=port, scheme=scheme, verify=settings.verify,
                            connections_timeout=settings.timeout_s)
    client.http.session = http_session(settings)
    client.settings = settings
    return client


def _client(client_or_settings: consul.Consul | ConsulSettings) -> consul.Consul:
    if isinstance(client_or_settings, ConsulSettings):
        return make_client(client_or_settings)
    return client_or_settings


def address_of(client: consul.Consul) -> str:
    return client.http.base_uri


def translate_error(exc: BaseException, address: str, what: str) -> ConsulError:
    """Map requests / py-consul exceptions to one-line errors that say what to fix."""
    if isinstance(exc, ConsulError):
        return exc
    tls_failure = consul_tls.describe_failure(exc, address, what)
    if tls_failure is not None:
        return ConsulUnreachable(tls_failure)
    if isinstance(exc, requests.exceptions.SSLError):
        return ConsulUnreachable(f"TLS to Consul at {address} failed while {what} "
                                 f"(set CONSUL_CACERT or consul.ca_file to the CA bundle)")
    if isinstance(exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
        return ConsulUnreachable(f"cannot reach Consul at {address} while {what} ({ADDRESS_HELP})")
    if isinstance(exc, consul.ACLPermissionDenied):
        return ConsulPermissionDenied(f"Consul at {address} denied {what}: permission denied ({TOKEN_HELP})")
    if isinstance(exc, consul.ConsulException):
        return ConsulError(f"Consul at {address} failed {what}: {str(exc)[:200]}")
    return ConsulError(f"Consul at {address} failed {what}: {type(exc).__name__}: {str(exc)[:200]}")


@dataclass(frozen=True)
class KeyState:
    """One successful read. `value` is the single key's bytes (None = absent);
    `entries` holds key -> bytes for a recursive read (None for a single key)."""

    index: int
    value: bytes | None = None
    entries: Mapping[str, bytes | None] | None = None

    @property
    def absent(self) -> bool:
        return self.value is None and not self.entries


def _blocking_read(client: consul.Consul, what: str, index: int, wait_s: float | None,
                   call: Callable[[str | None], tuple[Any, Any]]) -> tuple[int, Any]:
    """One (optionally blocking) py-consul read: `call(wait)` -> (X-Consul-Index, data).
    Its errors become ConsulError; an index that is not an integer is refused."""
    wait = f"{max(1, math.ceil(wait_s))}s" if wait_s and index else None
    try:
        raw_index, data = call(wait)
    except Exception as exc:  # requests and py-consul raise many types; all mean "no answer"
        raise translate_error(exc, address_of(client), what) from None
    try:
        return int(raw_index), data
    except (TypeError, ValueError):
        raise ConsulError(f"Consul at {address_of(client)} sent a bad X-Consul-Index {raw_index!r:.40}") from None


def read_key(client: consul.Consul, key: str, *, index: int = 0, wait_s: float | None = None,
             recurse: bool = False, require_nonempty: bool = False) -> KeyState:
    """One (optionally blocking) KV read. Raises ConsulError subclasses; a 404 on a
    single key returns KeyState(value=None)."""
    new_index, data = _blocking_read(client, f"reading {key!r}", index, wait_s,
                                     lambda wait: client.kv.get(key, index=index or None, wait=wait, recurse=recurse))
    if recurse:
        entries = _entries(data, client, key)
        if not entries and require_nonempty:
            raise ConsulEmptyPrefix(f"Consul at {address_of(client)} returned no keys under {key!r} "
                                    f"(missing, or hidden by ACLs: {TOKEN_HELP})")
        return KeyState(index=new_index, entries=entries)
    return KeyState(index=new_index, value=_value(data, client, key))


def _bad_shape(client: consul.Consul, key: str, expected: str, data: Any) -> ConsulError:
    return ConsulError(f"Consul's answer for {key!r} from {address_of(client)}: expected {expected}, "
                       f"got {type(data).__name__} {_excerpt(data)}")


def _excerpt(data: Any) -> str:
    """A short one-line view of what was read, for the error message."""
    return " ".join(repr(data)[:80].split())


def _kv_object(item: Any, client: consul.Consul, key: str) -> tuple[str, bytes | None]:
    """One KV object of py-consul's decoded answer: (its Key, its Value's bytes or None)."""
    if not isinstance(item, Mapping) or not isinstance(item.get("Key"), str):
        raise _bad_shape(client, key, "KV objects with a string Key", item)
    value = item.get("Value")
    if value is not None and not isinstance(value, bytes):
        raise _bad_shape(client, key, "a base64 string or null as each Value", value)
    return item["Key"], value


def _value(data: Any, client: consul.Consul, key: str) -> bytes | None:
    """A single key's bytes from py-consul's decoded answer (None: a 404, the key is
    absent). A 200 answer must be one KV object: anything else is refused, never taken
    for "absent" or for an empty value."""
    if data is None:
        return None
    return _kv_object(data, client, key)[1] or b""


def _entries(data: Any, client: consul.Consul, key: str) -> dict[str, bytes | None]:
    """key -> bytes of a recursive read's answer (None: a 404, no key under the prefix)."""
    if data is None:
        return {}
    if not isinstance(data, list):
        raise _bad_shape(client, key, "a list of KV objects", data)
    return dict(_kv_object(item, client, key) for item in data)


MAX_INSTANCES = 10_000  # instances of one service read from the catalog; more is refused


@dataclass(frozen=True)
class ServiceState:
    index: int
    instances: tuple[tuple[str, int], ...]  # (address, port) of each passing instance


def read_service(client: consul.Consul, service: str, *, index: int = 0,
                 wait_s: float | None = None) -> ServiceState:
    """One (optionally blocking) read of /v1/health/service/NAME?passing: the address
    (the service's, else its node's) and port of each passing instance."""
    what = f"reading the health of service {service!r}"
    new_index, data = _blocking_read(client, what, index, wait_s,
                                     lambda wait: client.health.service(service, index=index or None, wait=wait,
                                                                        passing=True))
    if not isinstance(data, list):
        raise ConsulError(f"Consul at {address_of(client)} sent no list {what}")
    if len(data) > MAX_INSTANCES:
        raise ConsulError(f"Consul at {address_of(client)} listed {len(data)} instances {what}: "
                          f"over {MAX_INSTANCES}")
    instances = []
    for entry in data:
        try:
            svc, node = entry["Service"], entry["Node"]
            address = svc.get("Address") or node.get("Address")
            port = svc["Port"]
        except (KeyError, TypeError, AttributeError):
            raise ConsulError(f"Consul at {address_of(client)} sent a malformed entry {what}") from None
        if not isinstance(address, str) or isinstance(port, bool) or not isinstance(port, int):
            raise ConsulError(f"Consul at {address_of(client)} sent a bad address or port {what}")
        instances.append((address, port))
    return ServiceState(index=new_index, instances=tuple(sorted(set(instances))))


# --- transactions -------------------------------------------------------------------

def _b64(value: bytes | str) -> str:
    raw = value.encode("utf-8") if isinstance(value, str) else value
    return base64.b64encode(raw).decode("ascii")


def op_set(key: str, value: bytes | str, flags: int | None = None) -> dict:
    kv: dict[str, Any] = {"Verb": "set", "Key": key, "Value": _b64(value)}
    if flags is not None:
        kv["Flags"] = flags
    return {"KV": kv}


def op_check_session(key: str, session: str) -> dict:
    """Fencing: the txn rolls back unless `session` holds the lock on `key`."""
    return {"KV": {"Verb": "check-session", "Key": key, "Session": session}}


def op_get(key: str) -> dict:
    return {"KV": {"Verb": "get", "Key": key}}


def op_delete(key: str) -> dict:
    return {"KV": {"Verb": "delete", "Key": key}}


def _txn_callback(address: str) -> Callable[[consul.base.Response], list[dict]]:
    def callback(response: consul.base.Response) -> list[dict]:
        body: Any = None
        try:
            body = (bounded_json.loads(response.body, max_bytes=MAX_ANSWER_BYTES, what="Consul's txn answer")
                    if response.body else None)
        except (TypeError, ValueError):
            body = None
        if response.code == 409:
            errors = list(((body or {}).get("Errors") if isinstance(body, dict) else None) or [])
            # Consul reports ACL denials inside a 409 too; they are not a lost fence.
            denied = [e for e in errors if "permission denied" in str(e.get("What", "")).lower()]
            if denied:
                raise ConsulPermissionDenied(f"Consul at {address} denied the transaction: "
                                             f"{str(denied[0].get('What'))[:120]} ({TOKEN_HELP})")
            raise TxnConflict(errors)
        if response.code == 403:
            raise ConsulPermissionDenied(f"Consul at {address} denied the transaction ({TOKEN_HELP})")
        if response.code != 200 or not isinstance(body, dict):
            raise ConsulError(f"Consul at {address} failed the transaction: HTTP {response.code} "
                              f"{str(response.body)[:200]}")
        results = []
        for result in body.get("Results") or []:
            kv = dict(result.get("KV") or {})
            if kv.get("Value") is not None:
                kv["Value"] = base64.b64decode(kv["Value"])
            results.append({"KV": kv})
        return results
    return callback


def txn(client_or_settings: consul.Consul | ConsulSettings, ops: Sequence[dict]) -> list[dict]:
    """PUT /v1/txn with the client's token (py-consul's Txn.put sends none). Returns the
    Results list (KV Values decoded to bytes); raises TxnConflict on rollback (409)."""
    if not ops:
        raise ValueError("txn needs at least one operation")
    if len(ops) > MAX_TXN_OPS:
        raise ValueError(f"txn has {len(ops)} operations; Consul allows at most {MAX_TXN_OPS}")
    client = _client(client_or_settings)
    address = address_of(client)
    try:
        return client.http.put(_txn_callback(address), "/v1/txn", data=json.dumps(list(ops)),
                               headers=client.prepare_headers())
    except Exception as exc:
        raise translate_error(exc, address, "running a transaction") from None


# --- blocking watch -----------------------------------------------------------------

def next_index(previous: int, returned: int) -> int:
    """The index for the next blocking call, per Consul's rules (see module doc)."""
    if returned < previous:
        return 0
    if returned <= 0:
        return 1
    return returned


def backoff_delay(attempt: int, base_s: float, cap_s: float, rng: random.Random) -> float:
    """Exponential backoff with "equal jitter": half fixed, half random, so retries
    spread out but never collapse to ~0 (which would hammer a recovering server)."""
    ceiling = min(cap_s, base_s * (2 ** min(attempt, 30)))
    return ceiling / 2 + rng.uniform(0, ceiling / 2)


def rate_limit_delay(last_call_started: float | None, now: float, min_interval_s: float) -> float:
    """How long to wait before the next call so calls start >= min_interval_s apart."""
    if last_call_started is None:
        return 0.0
    return max(0.0, last_call_started + min_interval_s - now)


class KeyWatch:
    """A blocking watch on one key (or a prefix with recurse=True).

    `run(on_change, stop)` loops until `stop` is set, calling `on_change(state)` when the
    value differs from the last one delivered (the first successful read always counts),
    and `on_error(exc)` on every failed call before backing off. Consul returning
    without a change (timeout, idempotent write) is not a change. Nothing a call or a
    callback raises ends the loop (fail static): an exception that is not a ConsulError
    counts as a failed call too, reaching `on_error` as a one-line ConsulError.
    """

    def __init__(self, client: consul.Consul, key: str, *, recurse: bool = False,
                 require_nonempty: bool = False, wait_s: float = 30.0, min_interval_s: float = 0.05,
                 backoff_base_s: float = 0.2, backoff_cap_s: float = 10.0,
                 rng: random.Random | None = None) -> None:
        self.client = client
        self.key = key
        self.recurse = recurse
        self.require_nonempty = require_nonempty
        self.wait_s = wait_s
        self.min_interval_s = min_interval_s
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s
        self.rng = rng or random.Random()
        self.index = 0
        self.errors = 0  # failed calls since creation
        self.consecutive_errors = 0
        self._unexpected = 0  # failures that were not ConsulErrors
        self._last_started: float | None = None

    def poll(self) -> KeyState:
        """One call: blocking when an index is known. Updates the index."""
        self._last_started = time.monotonic()
        state = read_key(self.client, self.key, index=self.index, wait_s=self.wait_s,
                         recurse=self.recurse, require_nonempty=self.require_nonempty)
        self.index = next_index(self.index, state.index)
        return state

    def run(self, on_change: Callable[[KeyState], None], stop: threading.Event,
            on_error: Callable[[ConsulError], None] | None = None) -> None:
        delivered: KeyState | None = None
        while not stop.is_set():
            if stop.wait(rate_limit_delay(self._last_started, time.monotonic(), self.min_interval_s)):
                return
            try:
                state = self.poll()
            except Exception as exc:  # fail static: no answer, however odd, ends the watch
                if stop.wait(self._failed(self._as_consul_error(exc), on_error)):
                    return
                continue
            self.consecutive_errors = 0
            if stop.is_set():
                return
            if delivered is None or (state.value, state.entries) != (delivered.value, delivered.entries):
                delivered = state
                self._deliver(on_change, state)

    def _as_consul_error(self, exc: Exception) -> ConsulError:
        """ConsulErrors as they are; anything else is a bug here or in py-consul, logged
        with its traceback the first time (later ones at debug, so a server repeating a
        bad answer cannot flood the log) and passed on as one line."""
        if isinstance(exc, ConsulError):
            return exc
        self._unexpected += 1
        level = logging.ERROR if self._unexpected == 1 else logging.DEBUG
        log.log(level, "watch %s: unexpected %s reading Consul", self.key, type(exc).__name__, exc_info=True)
        return ConsulError(f"reading {self.key!r} from {address_of(self.client)} failed unexpectedly: "
                           f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}")

    def _failed(self, exc: ConsulError, on_error: Callable[[ConsulError], None] | None) -> float:
        """Count a failed call and return how long to back off."""
        self.errors += 1
        self.consecutive_errors += 1
        # An error may mean the server restarted with other indexes: start over.
        self.index = 0
        if on_error is not None:
            try:
                on_error(exc)
            except Exception:
                log.exception("watch %s: on_error callback failed", self.key)
        delay = backoff_delay(self.consecutive_errors - 1, self.backoff_base_s, self.backoff_cap_s, self.rng)
        log.debug("watch %s: %s; retrying in %.2fs", self.key, exc, delay)
        return delay

    def _deliver(self, on_change: Callable[[KeyState], None], state: KeyState) -> None:
        """A failing callback is the caller's bug: logged, and the watch goes on (the
        same state is not delivered again; the next change is)."""
        try:
            on_change(state)
        except Exception:
            log.exception("watch %s: on_change callback failed", self.key)
