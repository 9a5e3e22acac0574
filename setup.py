"""Which packages go into the wheel (everything else is in pyproject.toml).

A node install sets AZPROBE_WITHOUT_DEVTOOLS=1 (scripts/install.sh does): the wheel then
carries the agent, the controller, the consumers and their contracts, and none of the
dev tools (azprobe.dev: the lab, devconsul, the demo) — docs/operations.md, "Install".
"""

import os

from setuptools import find_packages, setup

MAPPED = {"agent": "azprobe.agent", "controller": "azprobe.controller", "bpf": "azprobe.bpf"}


def azprobe_packages() -> list[str]:
    packages = find_packages(include=["azprobe", "azprobe.*"])
    for folder, name in MAPPED.items():
        packages += [name] + [f"{name}.{sub}" for sub in find_packages(where=folder)]
    if os.environ.get("AZPROBE_WITHOUT_DEVTOOLS") == "1":
        packages = [p for p in packages if p != "azprobe.dev" and not p.startswith("azprobe.dev.")]
    return sorted(packages)


setup(packages=azprobe_packages())
