"""The controller's threading stress test (tests/integration/test_controller_threads.py) run
longer: AZPROBE_STRESS_S seconds (default 600) of catalog and operator-key churn every cycle.
Prints one JSON line: the seconds run and whether it passed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    seconds = float(os.environ.get("AZPROBE_STRESS_S", "600"))
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/integration/test_controller_threads.py"], cwd=ROOT,
                         env={**os.environ, "AZPROBE_STRESS_S": str(seconds)}, capture_output=True, text=True)
    print(json.dumps({"bench": "controller_threads", "stress_s": seconds,
                      "wall_s": round(time.monotonic() - started, 1), "passed": out.returncode == 0}))
    if out.returncode:
        sys.stderr.write(out.stdout[-4000:])
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
