"""Shared pytest fixtures. Being a conftest inside the `tests` package, this file also
puts the repository root on sys.path, so tests import `tests.helpers` (add fixtures here,
never delete others')."""


# --- devconsul (azprobe/dev/devconsul/testing.py): a real devconsul subprocess per test ---
import pytest  # noqa: E402

from azprobe.dev.devconsul.testing import DevConsul  # noqa: E402


@pytest.fixture
def devconsul(tmp_path):
    """A running devconsul with its data dir under tmp_path, so `.kill()` + `.start()`
    is a crash and a restart with state intact; killed after the test even when it
    fails. `.url`, `.host`, `.port`, `.request()`, `.parked_queries()`."""
    with DevConsul(data_dir=tmp_path / "devconsul") as dc:
        yield dc


# --- prerequisites of the `kernel` and `lab` markers: skip locally, fail under CI=true ---
from tests.helpers import marker_prerequisites  # noqa: E402


@pytest.hookimpl(tryfirst=True)  # before any fixture of the test builds a lab or loads BPF
def pytest_runtest_setup(item):
    marker_prerequisites(m.name for m in item.iter_markers())
