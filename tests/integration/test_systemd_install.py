"""`scripts/install.sh` (what `make install` runs) into temporary directories: a working
venv with bcc, units whose paths follow PREFIX and still verify, example configs that a
second run leaves alone."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # a real venv and a pip install: ~30 s the first time


def install(prefix: Path, units: Path, configs: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SYSTEMD_UNIT_DIR": str(units), "AZPROBE_CONFIG_DIR": str(configs)}
    return subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), str(prefix)], capture_output=True,
                          text=True, timeout=600, env=env)


def test_install_is_complete_and_idempotent(tmp_path):
    prefix, units, configs = tmp_path / "prefix", tmp_path / "units", tmp_path / "etc"
    first = install(prefix, units, configs)
    assert first.returncode == 0, first.stdout + first.stderr

    help_text = subprocess.run([str(prefix / "bin" / "azprobe"), "--help"], capture_output=True, text=True,
                               timeout=60).stdout
    assert "doctor" in help_text and "agent" in help_text
    assert (Path(subprocess.run([str(prefix / "bin" / "python"), "-c", "import bcc; print(bcc.__file__)"],
                                capture_output=True, text=True, timeout=60).stdout.strip())).exists()

    # A node gets the loop and its consumers, not the dev tools (lab, devconsul, demo).
    site = Path(subprocess.run([str(prefix / "bin" / "python"), "-c",
                                "import azprobe, pathlib; print(pathlib.Path(azprobe.__file__).parent)"],
                               capture_output=True, text=True, timeout=60, cwd=tmp_path).stdout.strip())
    assert {"agent", "controller", "bpf", "contracts", "consumers"} <= {p.name for p in site.iterdir()}
    assert not (site / "dev").exists()
    lab = subprocess.run([str(prefix / "bin" / "azprobe"), "lab", "status"], capture_output=True, text=True,
                         timeout=60)
    assert lab.returncode == 2 and "dev tool" in lab.stderr, lab.stderr

    for role in ("agent", "controller"):
        unit = (units / f"azprobe-{role}.service").read_text()
        assert f"ExecStart={prefix}/bin/azprobe {role} --config {configs}/{role}.toml" in unit
        assert "/opt/azprobe/" not in unit and "/etc/azprobe/" not in unit
        if shutil.which("systemd-analyze"):
            verify = subprocess.run(["systemd-analyze", "verify", str(units / f"azprobe-{role}.service")],
                                    capture_output=True, text=True, timeout=60)
            assert (verify.returncode, verify.stdout + verify.stderr) == (0, "")
        assert (configs / f"{role}.toml").read_text() == (ROOT / "systemd" / f"{role}.toml").read_text()

    # An operator edits a config; a re-run upgrades but keeps it.
    edited = configs / "agent.toml"
    edited.write_text(edited.read_text().replace('az = "az-a"', 'az = "az-b"'))
    second = install(prefix, units, configs)
    assert second.returncode == 0, second.stdout + second.stderr
    assert 'az = "az-b"' in edited.read_text()
    assert f"kept existing {edited}" in second.stdout
    assert "installed" not in second.stdout.replace("kept existing", "")  # units unchanged too


def test_relative_prefix_is_refused(tmp_path):
    result = install(Path("relative/prefix"), tmp_path / "u", tmp_path / "c")
    assert result.returncode == 2
    assert "PREFIX must be an absolute path" in result.stderr


def test_a_host_without_a_c_compiler_is_told_what_to_install(tmp_path):
    """The build compiles the controller (setup.py): without a compiler the install stops
    before it starts, in one line naming the packages and the plain-Python way."""
    env = {**os.environ, "CC": "azprobe-test-no-such-cc", "SYSTEMD_UNIT_DIR": str(tmp_path / "u"),
           "AZPROBE_CONFIG_DIR": str(tmp_path / "c")}  # CC: the compiler setuptools would run
    result = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), str(tmp_path / "prefix")],
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert "C compiler" in line and "apt-get install gcc python3-dev" in line and "AZPROBE_COMPILE=0" in line
    assert not (tmp_path / "prefix").exists()
