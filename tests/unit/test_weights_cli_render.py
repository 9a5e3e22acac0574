"""The `azprobe weights` table: readable at a glance, stale never shown as healthy."""

import pytest

from azprobe.errors import ConfigError
from azprobe.contracts.weights import ZoneWeights
from azprobe.consumers.weights_cli import render_table, weights_key_name
from tests.helpers import sample_weights_doc

NOW = 1_700_000_000.0


def test_fresh_table_has_header_and_rows_by_share():
    doc = sample_weights_doc(17, {"az-b": 15, "az-a": 85}, ttl_s=30, now=NOW - 3)
    lines = render_table(doc, "azprobe/v1/weights", NOW).splitlines()
    assert lines[0] == "weights at azprobe/v1/weights"
    assert lines[1] == ("generation 17  leader ctl-test  model default  view global  age 3.0s  "
                        "expires in 27.0s  state OK")
    assert lines[2].split() == ["AZ", "SHARE", "WEIGHT", "HEALTH", "SUCCESS", "P95", "ms", "UTIL", "STATE", "REASONS"]
    assert lines[3].split() == ["az-a", "85%", "1.000", "0.98", "99.90%", "12.3", "40%", "ok", "share", "85"]
    assert lines[4].split()[:2] == ["az-b", "15%"] and "degraded" in lines[4]


def test_stale_table_says_stale_everywhere():
    doc = sample_weights_doc(17, ttl_s=30, now=NOW - 100)
    text = render_table(doc, "k", NOW)
    lines = text.splitlines()
    assert lines[0] == "STALE: weights at k expired 70.0s ago; do not act on them (is the controller running?)"
    assert lines[1].endswith("state STALE (was ok)")
    assert [row.split()[7] for row in lines[3:]] == ["STALE", "STALE"]
    assert "degraded" not in text and " ok " not in text


def test_nulls_and_long_reasons():
    doc = sample_weights_doc(1, {"az-a": 100}, now=NOW)
    zone = doc.zones["az-a"]
    long = ZoneWeights(zone.weight, 100, zone.health, None, None, None, 0, "ok", ("x" * 100, "y"))
    from dataclasses import replace
    doc = replace(doc, zones={"az-a": long})
    row = render_table(doc, "k", NOW).splitlines()[3]
    assert row.split()[4:7] == ["-", "-", "-"]
    assert row.endswith("x" * 57 + "...")


def test_weights_key_name():
    assert weights_key_name(None) == "weights"
    assert weights_key_name("az-a") == "weights/from/az-a"
    with pytest.raises(ConfigError, match="--from"):
        weights_key_name("a/b")


def test_a_drained_zone_is_shown_as_failover_only_with_envoys_real_split():
    doc = sample_weights_doc(18, {"az-a": 50, "az-b": 1, "az-c": 49}, ttl_s=30, now=NOW - 3)
    last = render_table(doc, "k", NOW).splitlines()[-1]
    assert last.startswith("failover only (envoy-eds priority 1): az-b: 0% of requests")
    assert "az-a=51% az-c=49%" in last
    # not drained (share above the floor), and stale documents: no such line
    assert "failover" not in render_table(sample_weights_doc(19, {"az-a": 85, "az-b": 15}, now=NOW), "k", NOW)
    stale = sample_weights_doc(20, {"az-a": 50, "az-b": 1, "az-c": 49}, ttl_s=30, now=NOW - 100)
    assert "failover" not in render_table(stale, "k", NOW)


def test_the_cli_refuses_a_document_from_the_future():
    from azprobe.clients.consul import KeyState
    from azprobe.consumers.weights_cli import decode_or_explain
    from azprobe.errors import AzprobeError

    future = sample_weights_doc(2**52 + 1, now=9e10).dumps().encode()
    with pytest.raises(AzprobeError, match=r"weights at k are invalid: generated_at: .* a document from the future"):
        decode_or_explain(KeyState(1, future), "k", "http://127.0.0.1:8500", NOW)
    assert decode_or_explain(KeyState(1, sample_weights_doc(3, now=NOW).dumps().encode()), "k", "a", NOW).generation == 3
