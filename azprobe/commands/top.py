"""`azprobe top`: a live per-path table from an agent's /v1/windows (plain ANSI redraw)."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import click

from azprobe.clients.agent import WindowReader, request_headers
from azprobe.clients.transport import HttpError
from azprobe.contracts import bounded_json
from azprobe.config import read_token_file
from azprobe.errors import ConfigError, PrerequisiteError
from azprobe.contracts.window import PathStats, Window, WindowError

DEFAULT_AGENT = "http://127.0.0.1:9740"
CLEAR_SCREEN = "\x1b[H\x1b[2J"


MAX_DOC_BYTES = 4 * 1024 * 1024
TOKEN_FILE_HELP = "File holding the agent's bearer token (agent.token_file), when it requires one."


def fetch_json(url: str, timeout: float = 2.0, token: str = "") -> dict:
    """GET a JSON document from an agent; an unreachable agent is a PrerequisiteError."""
    headers = request_headers(token)
    headers["Accept"] = "application/json"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as resp:
            body = resp.read(MAX_DOC_BYTES + 1)
            if len(body) > MAX_DOC_BYTES:
                raise ValueError(f"more than {MAX_DOC_BYTES} bytes")
            return bounded_json.loads(body, max_bytes=MAX_DOC_BYTES, what=f"the answer of {url}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise _unreachable(url, exc) from None


def _unreachable(url: str, exc: BaseException) -> PrerequisiteError:
    reason = getattr(exc, "reason", exc)
    if getattr(exc, "code", None) in (401, 403) or "HTTP 401" in str(exc) or "HTTP 403" in str(exc):
        return PrerequisiteError(f"cannot read {url}: {reason} (the agent needs its token: pass --token-file)")
    return PrerequisiteError(f"cannot read {url}: {reason} (is `azprobe agent` running there? pass --agent URL)")


def token_from_option(path: str | None) -> str:
    if not path:
        return ""
    return read_token_file(path, "--token-file")


@dataclass
class PathSummary:
    src: str
    dst: str
    p95_rtt_ms: float | None
    p95_connect_ms: float | None
    conn_per_s: float
    failure_pct: float | None
    syn_retrans: int
    rto: int
    conn_attempts: int


def summarise(windows: Iterable[Window]) -> list[PathSummary]:
    """Merge the windows per path; percentiles from merged histograms, rates per second."""
    windows = list(windows)
    seconds = sum(w.end - w.start for w in windows) or 1.0
    merged: dict[tuple[str, str], PathStats] = {}
    for w in windows:
        for p in w.paths:
            merged.setdefault((p.src, p.dst), PathStats(p.src, p.dst)).merge(p)
    out = []
    for (src, dst), p in sorted(merged.items()):
        finished = p.conn_ok + p.conn_refused + p.conn_timeout
        rtt = p.rtt_us.quantile(0.95)
        connect = p.connect_us.quantile(0.95)
        out.append(PathSummary(
            src=src, dst=dst,
            p95_rtt_ms=None if rtt is None else rtt / 1000.0,
            p95_connect_ms=None if connect is None else connect / 1000.0,
            conn_per_s=p.conn_attempts / seconds,
            failure_pct=100.0 * (p.conn_refused + p.conn_timeout) / finished if finished else None,
            syn_retrans=p.syn_retrans, rto=p.rto, conn_attempts=p.conn_attempts))
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render_table(summaries: list[PathSummary], title: str) -> str:
    header = f"{'PATH':<24} {'P95 RTT ms':>10} {'P95 CONN ms':>11} {'CONN/s':>8} {'FAIL %':>7} {'SYN RTX':>8} {'RTO':>6}"
    lines = [title, header]
    for s in summaries:
        lines.append(f"{s.src + ' -> ' + s.dst:<24} {_fmt(s.p95_rtt_ms, '.2f'):>10} "
                     f"{_fmt(s.p95_connect_ms, '.2f'):>11} {s.conn_per_s:>8.1f} "
                     f"{_fmt(s.failure_pct, '.2f'):>7} {s.syn_retrans:>8} {s.rto:>6}")
    if not summaries:
        lines.append("(no TCP activity on any path yet)")
    return "\n".join(lines)


class WindowFollower:
    """The agent's last `keep` windows; starts over when the agent restarts (new boot_id)."""

    def __init__(self, agent_url: str, keep: int, token: str = "") -> None:
        try:
            self.reader = WindowReader(agent_url, token=token)
        except HttpError as exc:
            raise ConfigError("--agent", str(exc), "for example http://127.0.0.1:9740") from None
        self.agent_url = self.reader.base_url
        self.windows: deque[Window] = deque(maxlen=keep)

    def pull(self) -> None:
        try:
            pulled = self.reader.pull()
        except WindowError as exc:
            raise PrerequisiteError(f"agent {self.agent_url} sent a bad response: {exc}") from None
        except (OSError, ValueError) as exc:  # unreachable, HTTP status, body over the cap
            raise _unreachable(f"{self.agent_url}/v1/windows", exc) from None
        if pulled.errors:
            raise PrerequisiteError(f"agent {self.agent_url} sent a bad window: {pulled.errors[0]}")
        if pulled.restarted:
            self.windows.clear()
        self.windows.extend(pulled.windows)


@click.command("top")
@click.option("--agent", "agent_url", default=DEFAULT_AGENT, show_default=True, help="Agent base URL.")
@click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(0.1, 60), help="Seconds between redraws.")
@click.option("--windows", "span", default=5, show_default=True, type=click.IntRange(1, 300), help="Windows merged per row.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one document per refresh).")
@click.option("--once", is_flag=True, help="Print once and exit.")
@click.option("--token-file", type=click.Path(dir_okay=False), envvar="AZPROBE_AGENT_TOKEN_FILE",
              help=TOKEN_FILE_HELP)
def top_command(agent_url: str, interval: float, span: int, as_json: bool, once: bool,
                token_file: str | None) -> None:
    """Live per-path table: P95 RTT, P95 connect, conn/s, failure %, SYN retransmits, RTOs."""
    follower = WindowFollower(agent_url, keep=span, token=token_from_option(token_file))
    while True:
        follower.pull()
        summaries = summarise(follower.windows)
        if as_json:
            reader = follower.reader
            doc = {"node": reader.node, "az": reader.az, "boot_id": reader.boot_id,
                   "windows": len(follower.windows),
                   "last_seq": follower.windows[-1].seq if follower.windows else 0,
                   "paths": [asdict(s) for s in summaries]}
            click.echo(json.dumps(doc, separators=(",", ":")))
        else:
            title = (f"azprobe top  node {follower.reader.node}  az {follower.reader.az}  last {len(follower.windows)} "
                     f"windows  {time.strftime('%H:%M:%S')}")
            click.echo(("" if once else CLEAR_SCREEN) + render_table(summaries, title))
        sys.stdout.flush()
        if once:
            return
        time.sleep(interval)  # pacing a display, not synchronising
