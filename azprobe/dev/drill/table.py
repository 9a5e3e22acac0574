"""The drill's table for people. Pure text."""

from __future__ import annotations

from typing import Any

from azprobe.dev.drill.metrics import ModeFigures

HEADER = ("mode", "requests", "ok %", "P50", "P95", "P99", "P99.9", "P99 fault", "ok % fault", "sick share",
          "detect", "recover")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms" if value >= 10 else f"{value:.1f} ms"


def _pct(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _share(client: float | None, envoy: float | None) -> str:
    def one(v: float | None) -> str:
        return "-" if v is None else f"{v * 100:.1f}%"
    return f"{one(envoy)} ({one(client)})"


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def row(f: ModeFigures) -> tuple[str, ...]:
    a = f.after_detection
    return (f.mode, str(a.requests), _pct(a.success_pct), _ms(a.p50_ms), _ms(a.p95_ms), _ms(a.p99_ms),
            _ms(a.p999_ms), _ms(f.fault.p99_ms), _pct(f.fault.success_pct),
            _share(a.sick_share_client, a.sick_share_envoy), _s(f.detect_s), "-" if f.detect_s is None else _s(f.recover_s))


def render(figures: list[ModeFigures], doc: dict[str, Any]) -> str:
    rows = [HEADER] + [row(f) for f in figures]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in rows]
    sick = ", ".join(figures[0].sick_azs) if figures else "-"
    notes = [
        f"drill {doc['scenario']}: {doc['rate_rps']:g} requests/s from {doc['client_az']} through Envoy, "
        f"fault {doc['fault_s']:g} s on {sick}",
        "requests .. P99.9 and sick share: the fault window after detection (a mode that never detects: after "
        "the first 5 s); 'P99 fault', 'ok % fault': the whole fault window",
        "sick share: the sick AZ's share of requests per Envoy's admin counters (the client's view in brackets);"
        " detect/recover: from the data plane (the sick AZ's request share)",
    ]
    kv = [f for f in figures if f.kv_detect_s is not None]
    for f in kv:
        notes.append(f"{f.mode}: Consul KV showed the drain {_s(f.kv_detect_s)} and the recovery "
                     f"{_s(f.kv_recover_s)} after the fault started/cleared")
    return "\n".join(lines + [""] + notes)
