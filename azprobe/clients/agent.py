"""The one client of an agent's `/v1/windows`: the controller (async, many agents),
`azprobe top` and the demo's live view (sync, one agent) all read windows through it.

It asks for the compact encoding and reads JSON from agents that only speak JSON
(windowcodec), sends the bearer token when one is configured, and bounds the body.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass, field

from azprobe.clients.transport import MAX_BODY_BYTES, AgentHttpClient, Endpoint, HttpError, PeerCertificate
from azprobe.contracts.window import Window, WindowError, printable
from azprobe.contracts.windowcodec import ACCEPT_BOTH, WindowsPage, decode_page


class AgentHttpStatus(ValueError):
    """The agent answered, but not 200 (401 without the right token, 5xx, ...)."""


def windows_path(after: int) -> str:
    return f"/v1/windows?after={int(after)}"


def request_headers(token: str = "") -> dict[str, str]:
    headers = {"Accept": ACCEPT_BOTH}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def _page(status: int, content_type: str, body: bytes, max_body_bytes: int) -> WindowsPage:
    if status != 200:
        raise AgentHttpStatus(f"HTTP {status}")
    return decode_page(body, content_type, max_bytes=max_body_bytes)


async def pull_page(http: AgentHttpClient, ep: Endpoint, after: int, *, token: str = "",
                    timeout_s: float = 5.0) -> WindowsPage:
    """One page of windows after `after` (async, on the caller's connection pool).
    Raises TimeoutError, OSError, HttpError, AgentHttpStatus or WindowError."""
    page, _ = await pull_answer(http, ep, after, token=token, timeout_s=timeout_s)
    return page


async def pull_answer(http: AgentHttpClient, ep: Endpoint, after: int, *, token: str = "",
                      timeout_s: float = 5.0) -> tuple[WindowsPage, PeerCertificate | None]:
    """pull_page, and the certificate of the connection that answered (https; else None)."""
    response = await http.get(ep, windows_path(after), timeout_s, request_headers(token))
    return _page(response.status, response.content_type, response.body, http.max_body_bytes), response.peer


def fetch_page(base_url: str, after: int, *, token: str = "", timeout_s: float = 2.0,
               max_body_bytes: int = MAX_BODY_BYTES) -> WindowsPage:
    """The same, blocking, for one agent. Raises OSError (unreachable, timeout),
    AgentHttpStatus, HttpError (body over the cap) or WindowError."""
    Endpoint.parse(base_url)  # the same URL rules as the controller (no port 0)
    request = urllib.request.Request(base_url.rstrip("/") + windows_path(after), headers=request_headers(token))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 - http(s) checked above
            body = resp.read(max_body_bytes + 1)
            if len(body) > max_body_bytes:
                raise HttpError(f"body exceeds the cap of {max_body_bytes} bytes")
            return _page(resp.status, resp.headers.get("Content-Type", ""), body, max_body_bytes)
    except urllib.error.HTTPError as exc:
        exc.close()
        raise AgentHttpStatus(f"HTTP {exc.code}") from None


@dataclass
class Pulled:
    windows: list[Window] = field(default_factory=list)
    errors: list[WindowError] = field(default_factory=list)  # windows that broke the contract
    restarted: bool = False  # the agent has a new boot_id since the last pull


class WindowReader:
    """Follows one agent's windows, blocking: each pull returns the windows new since
    the last one, and starts over from seq 0 when the agent restarted (new boot_id).
    The controller keeps richer cursors (gaps, duplicates) in controller.collect."""

    def __init__(self, base_url: str, *, token: str = "", timeout_s: float = 2.0) -> None:
        Endpoint.parse(base_url)
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self.after = 0
        self.boot_id: str | None = None
        self.node = self.az = ""

    def pull(self) -> Pulled:
        page = fetch_page(self.base_url, self.after, token=self.token, timeout_s=self.timeout_s)
        out = Pulled(restarted=self.boot_id is not None and page.boot_id != self.boot_id)
        if out.restarted:
            self.after = 0
            page = fetch_page(self.base_url, 0, token=self.token, timeout_s=self.timeout_s)
        # node and az are shown on terminals: from the network, so never a control character
        self.boot_id, self.node, self.az = page.boot_id, printable(page.node, 64), printable(page.az, 64)
        for pending in page.windows:
            try:
                window = pending.parse()
            except WindowError as exc:
                out.errors.append(exc)
                if pending.seq is not None:
                    self.after = max(self.after, pending.seq)
                continue
            out.windows.append(window)
            self.after = max(self.after, window.seq)
        return out
