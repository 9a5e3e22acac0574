"""The e2e tests' one lab stack (lab + devconsul + one BPF agent per client node), shared
by every test that takes `loop_stack`: each run on it starts its own controllers, Envoy
and clients on a fresh KV prefix, so the tests do not see each other's weights, and the
stack's start-up (namespaces, traffic, 9 agents compiling the probe) is paid once.

A package fixture, so it goes down with the last e2e test; the tests that build a lab of
their own (the host drill's 18 servers, the interrupted demo) run before the first test
that takes it, so two labs' traffic and agents never share the 2 cores during a drill."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from azprobe.dev.demo.runner import LoopStack

HERE = Path(__file__).resolve().parent
SHARED = "loop_stack"


@pytest.fixture(scope="package")
def loop_stack() -> Iterator[LoopStack]:
    if os.geteuid() != 0:
        pytest.skip("needs root: network namespaces and BPF")
    from azprobe.dev.lab.envoy import envoy_binary
    from azprobe.dev.lab.lab import unique_lab_name

    envoy_binary()  # a missing Envoy is a setup error, said up front
    with LoopStack(lab_name=unique_lab_name("e2e")) as stack:
        yield stack


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The e2e tests without the shared stack first, then those with it (each group in
    its own order)."""
    mine = [i for i, item in enumerate(items) if HERE in item.path.parents]
    if not mine:
        return
    lo, hi = mine[0], mine[-1] + 1
    items[lo:hi] = sorted(items[lo:hi], key=lambda item: SHARED in getattr(item, "fixturenames", ()))
