"""ACLs as devconsul knows them: off, or a master token with default deny.

Consul resolves the token first: an unknown secret is "ACL not found" (403) on every
endpoint that resolves tokens; no token at all is the anonymous token, which under
default-deny gets "Permission denied" (403) on single-key reads and writes, while list
endpoints are filtered (a recursive KV read comes back 404, with
X-Consul-Results-Filtered-By-ACLs when something was hidden).

Tokens besides the master one are made with PUT /v1/acl/token and revoked with DELETE
/v1/acl/token/<AccessorID>, so a test can rotate a client's token for real. devconsul
has no policies: a made token may do everything but manage ACLs (the master's alone).
They live in memory only, gone at a restart.
"""

from __future__ import annotations

import enum
import hmac
import threading
import uuid

from aiohttp import web


class Identity(enum.Enum):
    DISABLED = "disabled"  # ACLs off: everything allowed
    MASTER = "master"
    TOKEN = "token"  # one made with PUT /v1/acl/token
    ANONYMOUS = "anonymous"


class AclNotFound(Exception):
    """A token was given but is not one we know."""


def request_token(request: web.Request) -> str:
    """Consul's order: X-Consul-Token, then Authorization: Bearer, then ?token=."""
    token = request.headers.get("X-Consul-Token", "")
    if not token:
        auth = request.headers.get("Authorization", "")
        if auth[:7].lower() == "bearer ":
            token = auth[7:].strip()
    if not token:
        token = request.query.get("token", "")
    return token


class AclResolver:
    def __init__(self, master_token: str | None) -> None:
        self.master_token = master_token or None
        self._tokens: dict[str, str] = {}  # SecretID -> AccessorID
        self._lock = threading.Lock()

    def create(self, secret: str | None = None) -> tuple[str, str]:
        """(AccessorID, SecretID) of a new token; `secret` chosen by the caller, else random."""
        accessor, secret = str(uuid.uuid4()), secret or str(uuid.uuid4())
        with self._lock:
            if secret in self._tokens or secret == self.master_token:
                raise ValueError("SecretID is already in use")
            self._tokens[secret] = accessor
        return accessor, secret

    def revoke(self, accessor: str) -> bool:
        with self._lock:
            for secret, known in list(self._tokens.items()):
                if known == accessor:
                    del self._tokens[secret]
                    return True
        return False

    @property
    def enabled(self) -> bool:
        return self.master_token is not None

    @property
    def default_policy(self) -> str:
        return "deny" if self.enabled else "allow"

    def resolve(self, request: web.Request) -> Identity:
        if self.master_token is None:
            return Identity.DISABLED
        token = request_token(request)
        if not token or token == "anonymous":
            return Identity.ANONYMOUS
        if hmac.compare_digest(token.encode(), self.master_token.encode()):
            return Identity.MASTER
        with self._lock:
            if token in self._tokens:
                return Identity.TOKEN
        raise AclNotFound()

    @staticmethod
    def allowed(identity: Identity) -> bool:
        return identity is not Identity.ANONYMOUS


def permission_denied(permission: str, resource: str) -> str:
    """Consul's wording for the anonymous token under default deny."""
    return (f"Permission denied: anonymous token lacks permission '{permission}' on \"{resource}\". "
            "The anonymous token is used implicitly when a request does not specify a token.")
