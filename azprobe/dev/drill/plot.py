"""The drill's timeline picture (matplotlib, headless): one column per mode; rows: each
AZ's share of requests, the users' P99, and errors per second; the fault shaded."""

from __future__ import annotations

from pathlib import Path

from azprobe.dev.drill.metrics import ModeFigures

COLOURS = {"az-a": "#4C72B0", "az-b": "#C44E52", "az-c": "#55A868"}


def plot_timeline(figures: list[ModeFigures], out: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    cols = len(figures)
    fig, axes = plt.subplots(3, cols, figsize=(4.2 * cols, 7.5), sharex="col", squeeze=False)
    for c, f in enumerate(figures):
        bins = [b for b in f.timeline if b.requests]
        t = [b.t for b in bins]
        share_ax, p99_ax, err_ax = axes[0][c], axes[1][c], axes[2][c]
        azs = sorted({az for b in bins for az in b.shares if az != "-"})
        for az in azs:
            share_ax.plot(t, [100 * b.shares.get(az, 0.0) for b in bins], label=az,
                          color=COLOURS.get(az), linewidth=1.5)
        p99_ax.plot(t, [b.p99_ms or 0.0 for b in bins], color="black", linewidth=1.2)
        err_ax.bar(t, [b.errors for b in bins], width=0.9, color="#C44E52")
        for ax in (share_ax, p99_ax, err_ax):
            ax.axvspan(0, f.fault_s, color="#f2c14e", alpha=0.25, linewidth=0)
            if f.detect_s is not None:
                ax.axvline(f.detect_s, color="grey", linestyle="--", linewidth=0.8)
            ax.grid(alpha=0.3)
        share_ax.set_title(f"{f.mode}")
        share_ax.set_ylim(-2, 102)
        p99_ax.set_yscale("log")
        p99_ax.set_ylim(bottom=1)
        err_ax.set_ylim(bottom=0, top=max([1] + [b.errors for b in bins]) * 1.1)
        err_ax.set_xlabel("seconds since the fault started")
        if c == 0:
            share_ax.set_ylabel("share of requests %")
            p99_ax.set_ylabel("user P99 per second, ms")
            err_ax.set_ylabel("failed requests per second")
            share_ax.legend(loc="center left", fontsize=8)
    fig.suptitle(title or "drill: fault shaded, dashed line = detection in the data plane", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
