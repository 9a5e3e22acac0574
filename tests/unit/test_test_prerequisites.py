"""A test whose prerequisite is missing skips on a developer's box and FAILS under CI
(CI=true), saying what is missing and how to fix it (tests/helpers.py)."""

from __future__ import annotations

import pytest

from tests.helpers import in_ci, marker_prerequisites, require


@pytest.mark.parametrize("value, expected", [("true", True), ("1", True), ("yes", True), ("TRUE", True),
                                             ("", False), ("0", False), ("false", False), ("no", False)])
def test_ci_is_any_truthy_value(value, expected):
    assert in_ci({"CI": value}) is expected


def test_ci_unset_is_not_ci():
    assert in_ci({}) is False


def test_missing_prerequisite_fails_under_ci_with_the_fix(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception) as exc:
        require(False, "needs root (the lab builds network namespaces)", "run make test as root")
    assert "missing prerequisite: needs root (the lab builds network namespaces); run make test as root" in str(
        exc.value)


def test_missing_prerequisite_skips_outside_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as exc:
        require(False, "needs root", "run make test as root")
    assert str(exc.value) == "missing prerequisite: needs root; run make test as root"


def test_present_prerequisite_neither_skips_nor_fails(monkeypatch):
    monkeypatch.setenv("CI", "true")
    require(True, "needs root", "run make test as root")


def test_lab_marker_without_root_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr("tests.helpers.os.geteuid", lambda: 1000)
    with pytest.raises(pytest.fail.Exception, match="needs root .*run make test as root"):
        marker_prerequisites(["lab"])


def test_kernel_marker_names_the_agents_own_prerequisite(monkeypatch):
    import azprobe.agent.probe as probe

    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(probe.os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.fail.Exception, match="the kernel tests need BPF: not root"):
        marker_prerequisites(["kernel", "slow"])


def test_unmarked_tests_need_nothing(monkeypatch):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr("tests.helpers.os.geteuid", lambda: 1000)
    marker_prerequisites(["slow", "parametrize"])
