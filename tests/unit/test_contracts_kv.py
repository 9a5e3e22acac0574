"""The KV key layout: one place names every key the controller writes and readers read."""

import pytest

from azprobe.clients.consul import ConsulSettings
from azprobe.contracts import kv


def test_layout_under_the_prefix() -> None:
    settings = ConsulSettings(prefix="azprobe/v1/")
    assert settings.key(kv.LEADER) == "azprobe/v1/leader"
    assert settings.key(kv.weights_name()) == "azprobe/v1/weights"
    assert settings.key(kv.weights_name("az-a")) == "azprobe/v1/weights/from/az-a"
    assert settings.key(kv.FREEZE) == "azprobe/v1/control/freeze"
    assert settings.key(kv.shift_name("az-b")) == "azprobe/v1/control/shift/az-b"
    assert settings.key(kv.doctor_name("host-1")) == "azprobe/v1/doctor/host-1"
    assert kv.doctor_name("a/b") == "doctor/a_b"  # one path segment, whatever the host name


@pytest.mark.parametrize("bad", ["", "a/b", "x" * 257])
def test_bad_az_names_make_no_key(bad: str) -> None:
    with pytest.raises(ValueError, match="not an AZ name"):
        kv.weights_name(bad)
    with pytest.raises(ValueError, match="not an AZ name"):
        kv.shift_name(bad)


@pytest.mark.parametrize(("name", "switch"), [
    ("control/freeze", ("freeze", None)),
    ("control/shift/az-c", ("shift", "az-c")),
    ("control/shift/", None),
    ("control/host/198.18.2.12", ("host", "198.18.2.12")),
    ("control/host/", None),
    ("control/hosts-off", ("hosts-off", None)),
    ("control/other", None),
    ("weights", None),
])
def test_control_switch_names(name: str, switch: tuple[str, str | None] | None) -> None:
    assert kv.control_switch(name) == switch
