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

from azprobe.config import Section, read_token_file
from azprobe.contracts import bounded_json, kv
from azprobe.errors import AzprobeError, ConfigError

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "http://127.0.0.1:8500"
DEFAULT_PREFIX = kv.DEFAULT_PREFIX
MAX_TXN_OPS = 128  # Consul's limit per transaction
# The largest answer read: one KV value (base64 grows it by a third) with its metadata,
# with room for a recursive read of the few small switches under control/.
MAX_ANSWER_BYTES = 8 * kv.MAX_VALUE_BYTES
ADDRESS_HELP = "pass --consul URL or set CONSUL_HTTP_ADDR"
TOKEN_HELP = "set CONSUL_HTTP_TOKEN, CONSUL_HTTP_TOKEN_FILE or consul.token_file"


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
    """Where Consul is and how to authenticate. `token` is excluded from repr."""

    address: str = DEFAULT_ADDRESS
    token: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    prefix: str = DEFAULT_PREFIX
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", normalize_address(self.address))
        if self.prefix and not self.prefix.endswith("/"):
            object.__setattr__(self, "prefix", self.prefix + "/")
        if self.prefix.startswith("/"):
            raise ConfigError("consul.prefix", f"{self.prefix!r} starts with '/'", "use e.g. azprobe/v1/")

    def __repr__(self) -> str:
        token = "<set>" if self.token else "<none>"
        return (f"ConsulSettings(address={self.address!r}, token={token}, ca_file={self.ca_file!r}, "
                f"prefix={self.prefix!r})")

    __str__ = __repr__

    def key(self, name: str) -> str:
        """Full KV key for a name under the prefix, e.g. key("weights")."""
        return self.prefix + name.lstrip("/")

    @property
    def parts(self) -> tuple[str, str, int]:
        """(scheme, host, port) of the address."""
        url = urllib.parse.urlsplit(self.address)
        return url.scheme, url.hostname or "127.0.0.1", url.port or (443 if url.scheme == "https" else 8500)

    @classmethod
    def from_env(cls, address: str | None = None, prefix: str | None = None,
                 token_file: str | None = None, ca_file: str | None = None) -> "ConsulSettings":
        """Explicit arguments (CLI flags) win; then CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN_FILE,
        CONSUL_HTTP_TOKEN, CONSUL_CACERT; then the defaults."""
        return cls(
            address=address or os.environ.get("CONSUL_HTTP_ADDR") or DEFAULT_ADDRESS,
            token=resolve_token(token_file, "consul.token_file"),
            ca_file=ca_file or os.environ.get("CONSUL_CACERT") or None,
            prefix=DEFAULT_PREFIX if prefix is None else prefix,
        )

    @classmethod
    def from_section(cls, section: Section) -> "ConsulSettings":
        """The [consul] table of a config file (docs/contracts.md "Controller config"); empty values fall back to
        the environment, then to the defaults. Unknown keys are rejected."""
        address = section.string("address", "")
        token_file = section.string("token_file", "")
        ca_file = section.string("ca_file", "")
        prefix = section.string("prefix", DEFAULT_PREFIX)
        section.reject_unknown()
        try:
            normalize_address(address or os.environ.get("CONSUL_HTTP_ADDR") or DEFAULT_ADDRESS)
        except ConfigError as exc:
            raise ConfigError(section.field("address"), exc.problem, exc.fix) from None
        return cls(
            address=address or os.environ.get("CONSUL_HTTP_ADDR") or DEFAULT_ADDRESS,
            token=resolve_token(token_file or None, section.field("token_file")),
            ca_file=ca_file or os.environ.get("CONSUL_CACERT") or None,
            prefix=prefix,
        )


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


def resolve_token(token_file: str | None, field_name: str) -> str | None:
    """Consul's precedence: a token file beats a token; an explicit file beats the env."""
    path = token_file or os.environ.get("CONSUL_HTTP_TOKEN_FILE") or None
    if path:
        return read_token_file(path, field_name if token_file else "CONSUL_HTTP_TOKEN_FILE")
    return os.environ.get("CONSUL_HTTP_TOKEN") or None


# --- client -------------------------------------------------------------------------

class _BoundedHTTPClient(consul.std.HTTPClient):
    """py-consul's HTTP client, refusing an answer too large or too deeply nested before
    py-consul's own json.loads reads it (refused as a ConsulException, so callers see a
    ConsulError like any failed read)."""

    def response(self, response: requests.Response, raw: bool = False) -> consul.base.Response:
        if not raw:
            try:
                bounded_json.check(response.content, max_bytes=MAX_ANSWER_BYTES, what="Consul's answer")
            except bounded_json.JsonRefused as exc:
                raise consul.ConsulException(str(exc)) from None
        return super().response(response, raw)


class _BoundedConsul(consul.Consul):
    def http_connect(self, host: str, port: int, scheme: str, verify: bool | str = True,
                     cert: Any = None) -> consul.std.HTTPClient:
        return _BoundedHTTPClient(host, port, scheme, verify, cert, connections_timeout=self.connections_timeout)


def make_client(settings: ConsulSettings) -> consul.Consul:
    """A py-consul client for the settings. py-consul lets CONSUL_HTTP_TOKEN override an
    explicit token; we set the resolved token afterwards so the settings decide."""
    scheme, host, port = settings.parts
    verify: bool | str = settings.ca_file or True
    client = _BoundedConsul(host=host, port=port, scheme=scheme, verify=verify,
                            connections_timeout=settings.timeout_s)
    client.token = settings.token
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


def read_key(client: consul.Consul, key: str, *, index: int = 0, wait_s: float | None = None,
             recurse: bool = False, require_nonempty: bool = False) -> KeyState:
    """One (optionally blocking) KV read. Raises ConsulError subclasses; a 404 on a
    single key returns KeyState(value=None)."""
    what = f"reading {key!r}"
    wait = f"{max(1, math.ceil(wait_s))}s" if wait_s and index else None
    try:
        raw_index, data = client.kv.get(key, index=index or None, wait=wait, recurse=recurse)
    except Exception as exc:  # requests and py-consul raise many types; all mean "no answer"
        raise translate_error(exc, address_of(client), what) from None
    try:
        new_index = int(raw_index)
    except (TypeError, ValueError):
        raise ConsulError(f"Consul at {address_of(client)} sent a bad X-Consul-Index {raw_index!r:.40}") from None
    if recurse:
        entries = {item["Key"]: item.get("Value") for item in (data or [])}
        if not entries and require_nonempty:
            raise ConsulEmptyPrefix(f"Consul at {address_of(client)} returned no keys under {key!r} "
                                    f"(missing, or hidden by ACLs: {TOKEN_HELP})")
        return KeyState(index=new_index, entries=entries)
    value = None if data is None else (data.get("Value") or b"")
    return KeyState(index=new_index, value=value)


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
    without a change (timeout, idempotent write) is not a change.
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
            except ConsulError as exc:
                self.errors += 1
                self.consecutive_errors += 1
                # An error may mean the server restarted with other indexes: start over.
                self.index = 0
                if on_error is not None:
                    on_error(exc)
                delay = backoff_delay(self.consecutive_errors - 1, self.backoff_base_s,
                                      self.backoff_cap_s, self.rng)
                log.debug("watch %s: %s; retrying in %.2fs", self.key, exc, delay)
                if stop.wait(delay):
                    return
                continue
            self.consecutive_errors = 0
            if stop.is_set():
                return
            if delivered is None or (state.value, state.entries) != (delivered.value, delivered.entries):
                delivered = state
                on_change(state)
