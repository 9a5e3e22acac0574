"""Which packages go into the wheel, and which of their modules are compiled (everything
else is in pyproject.toml).

A node install sets AZPROBE_WITHOUT_DEVTOOLS=1 (scripts/install.sh does): the wheel then
carries the agent, the controller, the consumers and their contracts, and none of the
dev tools (azprobe.dev: the lab, devconsul, the demo) — docs/operations.md, "Install".

The controller's per-cycle path (pyproject.toml, [tool.azprobe] compiled) is compiled to
C with mypyc: the same Python source, type-checked by mypy as it is built, for about a
third less CPU a cycle (docs/scale.md, "Compiled"). It needs a C compiler and the Python
headers (Debian: gcc, python3-dev). AZPROBE_COMPILE=0 installs it all as plain Python.
"""

import os
import shutil
import tomllib
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
MAPPED = {"agent": "azprobe.agent", "controller": "azprobe.controller", "bpf": "azprobe.bpf"}


def azprobe_packages() -> list[str]:
    packages = find_packages(include=["azprobe", "azprobe.*"])
    for folder, name in MAPPED.items():
        packages += [name] + [f"{name}.{sub}" for sub in find_packages(where=folder)]
    if os.environ.get("AZPROBE_WITHOUT_DEVTOOLS") == "1":
        packages = [p for p in packages if p != "azprobe.dev" and not p.startswith("azprobe.dev.")]
    return sorted(packages)


def installed_layout() -> Path:
    """The package as it is installed, as links into the source folders, under build/.
    mypy names a module by its folders, so controller/quorum.py must be read as
    azprobe/controller/quorum.py to be compiled as azprobe.controller.quorum."""
    top = ROOT / "build" / "mypyc-src"
    shutil.rmtree(top, ignore_errors=True)
    package = top / "azprobe"
    package.mkdir(parents=True)
    for entry in (ROOT / "azprobe").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for folder, name in MAPPED.items():
        (package / name.rpartition(".")[2]).symlink_to(ROOT / folder)
    return top


def compiled_modules() -> list:
    if os.environ.get("AZPROBE_COMPILE", "1") == "0":
        return []
    from mypyc.build import mypycify  # a build requirement (pyproject.toml)

    sources = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["azprobe"]["compiled"]
    top = installed_layout()
    staged = []
    for path in sources:  # controller/quorum.py lies at azprobe/controller/quorum.py there
        folder, _, rest = path.partition("/")
        staged.append(top / MAPPED.get(folder, folder).replace(".", "/") / rest)
    return mypycify([str(p.relative_to(ROOT)) for p in staged], opt_level="3", group_name="azprobe")


setup(packages=azprobe_packages(), ext_modules=compiled_modules())
