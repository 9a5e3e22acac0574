"""The demo's live view: a pure function from what the scenario run knows now to text lines.

Plain ANSI (no curses, no extra dependency) so it reads well in a screen recording; when
stdout is not a terminal the runner prints `render_line` once per second instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from azprobe.commands.top import PathSummary

RESET, BOLD, DIM, RED, GREEN, YELLOW, CYAN = "\x1b[0m", "\x1b[1m", "\x1b[2m", "\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[36m"
HOME, ERASE_LINE, ERASE_BELOW = "\x1b[H", "\x1b[K", "\x1b[J"
BAR_WIDTH = 40


@dataclass(frozen=True)
class ZoneRow:
    az: str
    share: int
    weight: float
    health: float
    state: str
    p95_ms: float | None = None
    success: float | None = None


@dataclass(frozen=True)
class UserView:
    """What the users' requests through Envoy felt over the last few seconds."""

    window_s: float
    requests: int
    p99_ms: float | None
    success_pct: float | None
    split: Mapping[str, float]  # AZ -> fraction of requests, from Envoy's counters (else the client)
    split_source: str = "envoy"


@dataclass
class ViewState:
    scenario: str
    description: str
    phase: str  # starting | baseline | fault | recovery | done
    phase_elapsed_s: float = 0.0
    fault: str = ""  # what is injected right now, "" when healthy
    paths: list[PathSummary] = field(default_factory=list)
    zones: list[ZoneRow] = field(default_factory=list)
    generation: int | None = None
    doc_state: str = ""
    leader: str = ""
    kv_writes: int = 0
    detect_s: float | None = None
    recover_s: float | None = None
    log: list[str] = field(default_factory=list)  # recent events, newest last
    users: UserView | None = None  # the user traffic through Envoy, when the demo runs one


def zone_rows(doc: object) -> list[ZoneRow]:
    """From a parsed weights document (duck-typed: zones[az].share/weight/health/state)."""
    zones: Mapping = doc.zones  # type: ignore[attr-defined]
    return [ZoneRow(az=az, share=z.share, weight=z.weight, health=z.health, state=z.state,
                    p95_ms=getattr(z, "p95_ms", None), success=getattr(z, "success", None))
            for az, z in sorted(zones.items())]


def _fmt(value: float | None, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _paint(text: str, colour: str, ansi: bool) -> str:
    return f"{colour}{text}{RESET}" if ansi and colour else text


def _state_colour(state: str) -> str:
    return {"ok": GREEN, "degraded": YELLOW, "shifted": YELLOW, "panic": RED, "stale": RED,
            "frozen": CYAN}.get(state, "")


def render(state: ViewState, *, ansi: bool = True, sick: Iterable[str] = ()) -> list[str]:
    """The full-screen view as lines (no trailing newlines, no clear-screen code)."""
    sick_set = set(sick)
    phase_colour = {"fault": RED, "recovery": YELLOW, "baseline": GREEN}.get(state.phase, "")
    lines = [
        _paint(f"azprobe lab demo - {state.scenario}", BOLD, ansi) + f"  {state.description}",
        f"phase {_paint(state.phase.upper(), phase_colour, ansi)} {state.phase_elapsed_s:5.1f}s"
        + (f"   fault: {_paint(state.fault, RED, ansi)}" if state.fault else "   no fault"),
        "",
        _paint(f"{'path':<14}{'rtt p95':>10}{'conn p95':>10}{'conn/s':>8}{'fail %':>8}{'synrtx':>8}{'rto':>6}",
               BOLD, ansi),
        _paint(f"{'':<14}{'ms':>10}{'ms':>10}", DIM, ansi),
    ]
    for p in state.paths:
        row = (f"{p.src + '>' + p.dst:<14}{_fmt(p.p95_rtt_ms, '.1f'):>10}{_fmt(p.p95_connect_ms, '.1f'):>10}"
               f"{p.conn_per_s:8.1f}{_fmt(p.failure_pct, '7.1f'):>8}{p.syn_retrans:8d}{p.rto:6d}")
        lines.append(_paint(row, RED if p.dst in sick_set and state.fault else "", ansi))
    if not state.paths:
        lines.append(_paint("(waiting for the agent's first window)", DIM, ansi))
    lines += [
        "",
        _paint(f"{'zone':<8}{'share':>6}  {'':<{BAR_WIDTH}}{'weight':>8}{'health':>8}  state", BOLD, ansi),
    ]
    for z in state.zones:
        bar = "#" * round(z.share * BAR_WIDTH / 100)
        lines.append(f"{z.az:<8}{z.share:>5}%  {_paint(f'{bar:<{BAR_WIDTH}}', _state_colour(z.state), ansi)}"
                     f"{z.weight:8.3f}{z.health:8.3f}  {_paint(z.state, _state_colour(z.state), ansi)}")
    if not state.zones:
        lines.append(_paint("(waiting for the controller's first weights in Consul KV)", DIM, ansi))
    if state.users is not None:
        lines += ["", *_user_lines(state.users, sick_set, ansi)]
    figures = (f"generation {state.generation if state.generation is not None else '-'}"
               f"  state {_paint(state.doc_state or '-', _state_colour(state.doc_state), ansi)}"
               f"  leader {state.leader or '-'}  kv writes {state.kv_writes}"
               f"  detect {_seconds(state.detect_s)}  recover {_seconds(state.recover_s)}")
    lines += ["", figures, ""]
    lines += [_paint(entry, DIM, ansi) for entry in state.log[-5:]]
    return lines


def _user_lines(users: UserView, sick: set[str], ansi: bool) -> list[str]:
    split = "  ".join(_paint(f"{az} {share * 100:4.1f}%", RED if az in sick and share > 0.005 else "", ansi)
                      for az, share in sorted(users.split.items()))
    ok = _fmt(users.success_pct, ".2f")
    return [_paint(f"users through Envoy (last {users.window_s:g} s, {users.requests} requests)", BOLD, ansi),
            f"P99 {_fmt(users.p99_ms, '.1f')} ms   ok {ok} %   split ({users.split_source}): {split or '-'}"]


def render_line(state: ViewState, elapsed_s: float) -> str:
    """One line per second for logs and pipes: time, phase, shares, generation."""
    shares = " ".join(f"{z.az}={z.share}" for z in state.zones) or "shares=-"
    worst = [p for p in state.paths if p.p95_rtt_ms is not None]
    slowest = max(worst, key=lambda p: p.p95_rtt_ms or 0.0, default=None)
    slow = f" slowest={slowest.src}>{slowest.dst}:{slowest.p95_rtt_ms:.1f}ms" if slowest else ""
    users = ""
    if state.users is not None:
        split = ",".join(f"{az}:{share * 100:.1f}%" for az, share in sorted(state.users.split.items()))
        users = (f" users_p99={_fmt(state.users.p99_ms, '.1f')}ms users_ok={_fmt(state.users.success_pct, '.2f')}%"
                 f" envoy_split={split or '-'}")
    return (f"t={elapsed_s:6.1f}s phase={state.phase} {shares} state={state.doc_state or '-'}"
            f" gen={state.generation if state.generation is not None else '-'}{slow}{users}")


def frame(lines: Sequence[str]) -> str:
    """One redraw: home, each line erased to its end, then everything below erased.
    Overwriting in place instead of clearing the screen keeps a recording flicker-free."""
    return HOME + "".join(line + ERASE_LINE + "\n" for line in lines) + ERASE_BELOW
