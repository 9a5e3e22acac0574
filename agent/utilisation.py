"""Node utilisation for the window's `util` (fractions 0..1)."""

from __future__ import annotations

import psutil

from azprobe.contracts.window import Utilisation


class UtilisationSampler:
    def __init__(self) -> None:
        # The first cpu_percent(None) call only sets the baseline; it returns 0.0.
        psutil.cpu_percent(interval=None)

    def sample(self) -> Utilisation:
        cpu = psutil.cpu_percent(interval=None) / 100.0
        mem = psutil.virtual_memory().percent / 100.0
        return Utilisation(cpu=min(max(cpu, 0.0), 1.0), mem=min(max(mem, 0.0), 1.0))
