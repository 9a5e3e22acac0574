"""The scheduler extender's protocol answers and decision, without HTTP: bodies shaped as
kube-scheduler sends them (both nodeCacheCapable modes, real Node and Pod JSON), checked
field by field; the fail-static answers; the filter never empties a request."""

from __future__ import annotations

import json
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from azprobe.consumers.scheduler import scoring
from azprobe.consumers.scheduler.protocol import BadRequest, parse_args
from azprobe.consumers.scheduler.server import (ABSENT, FRESH, REJECTED, STALE_REASON, UNREACHABLE, WAITING, Extender,
                                                Usable, usable_weights)
from azprobe.consumers.scheduler.zones import LEGACY_ZONE_LABEL, ZONE_LABEL, NodeZones
from azprobe.consumers.watch import EMPTY, FRESH as WATCH_FRESH, STALE, WatcherStatus
from azprobe.contracts.weights import WeightsDoc, ZoneWeights
from azprobe.dev.kube import extender_body, node_object, pod_object

ZONES = ("az-a", "az-b", "az-c")


def zone(share: int, state: str = "ok") -> ZoneWeights:
    return ZoneWeights(1.0 if state == "ok" else 0.2, share, 0.95 if state == "ok" else 0.2, 0.999, 2.0, 0.3, 500,
                       state, ())


def doc(shares: dict[str, tuple[int, str]], now: float | None = None, ttl_s: float = 60.0) -> WeightsDoc:
    now = time.time() if now is None else now
    return WeightsDoc(7, now, now + ttl_s, "ctl", "default", "degraded",
                      {az: zone(share, state) for az, (share, state) in shares.items()})


DRAINED_C = {"az-a": (50, "ok"), "az-b": (49, "ok"), "az-c": (1, "degraded")}
HALF_B = {"az-a": (40, "ok"), "az-b": (20, "degraded"), "az-c": (40, "ok")}
HEALTHY = {"az-a": (34, "ok"), "az-b": (33, "ok"), "az-c": (33, "ok")}


class Fixed:
    def __init__(self, weights: WeightsDoc | None, reason: str = FRESH) -> None:
        self.weights, self.reason = weights, reason

    def usable(self) -> Usable:
        return Usable(self.weights, self.reason if self.weights is None else FRESH, "test")


def extender(weights: WeightsDoc | None, reason: str = FRESH, node_zones: NodeZones | None = None) -> Extender:
    return Extender(Fixed(weights, reason), node_zones or NodeZones(), max_nodes=100)


NODES = [node_object("n-a1", "az-a"), node_object("n-b1", "az-b"), node_object("n-c1", "az-c"),
         node_object("n-c2", "az-c"), node_object("n-none", None), node_object("n-x", "az-x")]
NAMES = [n["metadata"]["name"] for n in NODES]


def post(ext: Extender, verb: str, body: bytes) -> tuple[int, object]:
    status, out = ext.answer(verb, body)
    return status, json.loads(out)


# --- filter, full Node objects ----------------------------------------------------------

def test_filter_with_nodes_removes_only_the_failover_zone_and_echoes_the_kept_nodes() -> None:
    status, result = post(extender(doc(DRAINED_C)), "filter", extender_body(pod_object(), NODES))
    assert status == 200
    assert set(result) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert result["Error"] == ""
    assert result["NodeNames"] is None
    assert result["FailedNodes"] == {}
    assert sorted(result["FailedAndUnresolvableNodes"]) == ["n-c1", "n-c2"]
    assert "az-c is failover only" in result["FailedAndUnresolvableNodes"]["n-c1"]
    kept = result["Nodes"]["items"]
    assert kept == [NODES[0], NODES[1], NODES[4], NODES[5]]  # the objects as sent, byte for byte


def test_filter_with_names_answers_names() -> None:
    zones = NodeZones({"n-a1": "az-a", "n-b1": "az-b", "n-c1": "az-c", "n-c2": "az-c", "n-x": "az-x"})
    status, result = post(extender(doc(DRAINED_C), node_zones=zones), "filter",
                          extender_body(pod_object(), node_names=NAMES))
    assert status == 200
    assert result["Nodes"] is None
    assert result["NodeNames"] == ["n-a1", "n-b1", "n-none", "n-x"]
    assert sorted(result["FailedAndUnresolvableNodes"]) == ["n-c1", "n-c2"]
    assert result["Error"] == ""


def test_a_degraded_zone_above_the_drain_share_is_not_filtered() -> None:
    status, result = post(extender(doc(HALF_B)), "filter", extender_body(pod_object(), NODES))
    assert status == 200 and result["FailedAndUnresolvableNodes"] == {}
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == NAMES


def test_a_request_with_only_the_drained_zones_nodes_keeps_them_all() -> None:
    only_c = [node_object("n-c1", "az-c"), node_object("n-c2", "az-c")]
    status, result = post(extender(doc(DRAINED_C)), "filter", extender_body(pod_object(), only_c))
    assert status == 200 and result["FailedAndUnresolvableNodes"] == {} and result["Error"] == ""
    assert len(result["Nodes"]["items"]) == 2


# --- prioritize -------------------------------------------------------------------------

def test_prioritize_with_nodes_scores_follow_the_shares() -> None:
    status, result = post(extender(doc(HALF_B)), "prioritize", extender_body(pod_object(), NODES))
    assert status == 200
    assert result == [{"Host": "n-a1", "Score": 10}, {"Host": "n-b1", "Score": 5}, {"Host": "n-c1", "Score": 10},
                      {"Host": "n-c2", "Score": 10}, {"Host": "n-none", "Score": scoring.NEUTRAL_SCORE},
                      {"Host": "n-x", "Score": scoring.NEUTRAL_SCORE}]


def test_prioritize_a_failover_zone_scores_zero_with_names() -> None:
    # The first pattern yields "a", a zone the document does not list: neutral, never an error.
    zones_az = NodeZones({}, [re.compile(r"n-(?P<zone>[abc])\d"), re.compile(r"(?P<zone>az-[abc])-.*")])
    status, result = post(extender(doc(DRAINED_C), node_zones=zones_az), "prioritize",
                          extender_body(pod_object(), node_names=["n-a1"]))
    assert result == [{"Host": "n-a1", "Score": scoring.NEUTRAL_SCORE}]
    status, result = post(extender(doc(DRAINED_C), node_zones=zones_az), "prioritize",
                          extender_body(pod_object(), node_names=["az-a-1", "az-b-1", "az-c-1", "elsewhere"]))
    assert status == 200
    assert result == [{"Host": "az-a-1", "Score": 10}, {"Host": "az-b-1", "Score": 10},
                      {"Host": "az-c-1", "Score": 0}, {"Host": "elsewhere", "Score": scoring.NEUTRAL_SCORE}]


def test_names_mode_learns_zones_from_full_node_requests() -> None:
    zones = NodeZones()
    ext = extender(doc(DRAINED_C), node_zones=zones)
    post(ext, "prioritize", extender_body(pod_object(), NODES))
    status, result = post(ext, "prioritize", extender_body(pod_object(), node_names=["n-c1", "n-a1"]))
    assert result == [{"Host": "n-c1", "Score": 0}, {"Host": "n-a1", "Score": 10}]


def test_names_resolve_by_learned_label_then_table_then_pattern_within_the_bound() -> None:
    zones = NodeZones({"n-table": "az-b", "az-a-9": "az-c"}, (re.compile("(?P<zone>az-[a-c])-[0-9]+"),),
                      capacity=3)
    names = ["n-table", "az-a-9", "nobody", *[f"az-b-{i}" for i in range(20)]]
    for _ in range(2):  # the second time from the remembered answers
        assert zones.zones_of(names) == ["az-b", "az-c", None, *["az-b"] * 20]
        assert len(zones._configured) <= 2 + 3
    zones.learn([("az-b-1", "az-a"), ("n-table", None)])
    assert zones.zones_of(["az-b-1", "n-table"]) == ["az-a", "az-b"]  # a Node's own label wins
    assert zones.zone_of("az-c-1") == "az-c"


def test_the_legacy_zone_label_is_read_when_the_current_one_is_missing() -> None:
    node = node_object("n-old", None)
    node["metadata"]["labels"][LEGACY_ZONE_LABEL] = "az-c"
    status, result = post(extender(doc(DRAINED_C)), "prioritize", extender_body(pod_object(), [node]))
    assert result == [{"Host": "n-old", "Score": 0}]
    assert ZONE_LABEL not in node["metadata"]["labels"]


def test_filter_and_prioritize_read_the_same_zones_from_full_nodes() -> None:
    # The two verbs decode Nodes differently (a filter keeps each node's bytes for its
    # answer, a prioritize decodes in one pass): they must agree on every node's zone.
    legacy = node_object("n-legacy", None)
    legacy["metadata"]["labels"][LEGACY_ZONE_LABEL] = "az-c"
    both = node_object("n-both", "az-a")
    both["metadata"]["labels"][LEGACY_ZONE_LABEL] = "az-c"  # the current label wins
    unlabelled = node_object("n-unlabelled", "az-c")
    unlabelled["metadata"]["labels"] = None
    empty = node_object("n-empty", "")
    empty["metadata"]["labels"][LEGACY_ZONE_LABEL] = "az-c"  # an empty current label: the legacy one
    too_long = node_object("n-long", "z" * 64)
    nodes = [legacy, both, unlabelled, empty, too_long]
    expected = ("az-c", "az-a", None, "az-c", None)
    for keep_nodes in (True, False):
        candidates = parse_args(extender_body(pod_object(), nodes), max_nodes=10, node_zones=NodeZones(),
                                keep_nodes=keep_nodes)
        assert candidates.zones == expected
        assert len(candidates.raw_nodes) == (len(nodes) if keep_nodes else 0)
    ext = extender(doc(DRAINED_C))
    status, result = post(ext, "filter", extender_body(pod_object(), nodes))
    assert sorted(result["FailedAndUnresolvableNodes"]) == ["n-empty", "n-legacy"]
    status, result = post(ext, "prioritize", extender_body(pod_object(), nodes))
    assert [r["Score"] for r in result] == [0, 10, 5, 0, 5]


# A Node's members in any order, with text that looks like the cut `_node_head` makes
# (`,"spec":`, braces, quotes) inside strings, keys and nested values.
tricky_text = st.sampled_from(['', ',"spec":', '},"spec":{', '"', '\\', '}', 'az-a', 'x' * 2100, '{"spec":1}'])
json_leaf = st.one_of(st.none(), st.integers(-5, 5), tricky_text, st.text(max_size=8))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.one_of(tricky_text, st.just("spec")), inner, max_size=3)),
    max_leaves=8)


@st.composite
def node_json(draw: st.DrawFn) -> dict:
    labels = draw(st.one_of(st.none(), st.fixed_dictionaries(
        {}, optional={ZONE_LABEL: st.sampled_from(["az-a", "", "z" * 64]), LEGACY_ZONE_LABEL: st.just("az-c"),
                      "spec": tricky_text})))
    names = ["n-1", "n-2", "n-3", "n-4", "n-5", "n-6", ',"spec":', "", "x" * 254]  # the last two: 400
    metadata = {"name": draw(st.sampled_from(names)), "labels": labels,
                "annotations": draw(st.dictionaries(tricky_text, json_value, max_size=3))}
    members = {"metadata": metadata, "spec": draw(json_value), "status": draw(json_value),
               "kind": "Node", draw(tricky_text): draw(json_value)}
    order = draw(st.permutations(sorted(members)))
    return {key: members[key] for key in order if key in ("metadata", "spec") or draw(st.booleans())}


def zones_or_error(body: bytes, keep_nodes: bool) -> object:
    try:
        candidates = parse_args(body, max_nodes=10, node_zones=NodeZones(), keep_nodes=keep_nodes)
    except BadRequest as exc:
        return type(exc)
    return candidates.names, candidates.zones


@settings(max_examples=300, deadline=None)
@given(nodes=st.lists(node_json(), min_size=1, max_size=3), compact=st.booleans())
def test_a_filters_head_decode_agrees_with_the_whole_decode(nodes: list[dict], compact: bool) -> None:
    separators = (",", ":") if compact else (", ", ": ")
    body = json.dumps({"Pod": pod_object(), "Nodes": {"items": nodes}}, separators=separators).encode()
    assert zones_or_error(body, keep_nodes=True) == zones_or_error(body, keep_nodes=False)


def test_a_node_as_go_marshals_it_is_decoded_from_its_head() -> None:
    import msgspec

    from azprobe.consumers.scheduler.protocol import _node_head

    node = node_object("n-head", "az-b")
    head = _node_head(msgspec.Raw(json.dumps(node, separators=(",", ":")).encode()))
    assert head is not None and head.metadata.name == "n-head" and head.metadata.labels.zone == "az-b"
    spec_first = {"spec": node["spec"], "metadata": node["metadata"]}
    assert _node_head(msgspec.Raw(json.dumps(spec_first, separators=(",", ":")).encode())) is None


# --- fail static ------------------------------------------------------------------------

@pytest.mark.parametrize("reason", [STALE_REASON, ABSENT, UNREACHABLE, REJECTED, WAITING])
def test_without_usable_weights_filter_keeps_all_and_scores_are_equal(reason: str) -> None:
    ext = extender(None, reason)
    status, result = post(ext, "filter", extender_body(pod_object(), NODES))
    assert status == 200 and result["Error"] == "" and result["FailedAndUnresolvableNodes"] == {}
    assert len(result["Nodes"]["items"]) == len(NODES)
    status, result = post(ext, "prioritize", extender_body(pod_object(), node_names=NAMES))
    assert {r["Score"] for r in result} == {scoring.NEUTRAL_SCORE}
    metrics = ext.metrics.render().decode()
    assert f'azprobe_extender_neutral_answers_total{{reason="{reason}",verb="filter"}} 1.0' in metrics
    assert f'azprobe_extender_weights_state{{state="{reason}"}} 1.0' in metrics


def status_of(state: str, *, doc_: WeightsDoc | None = None, absent: bool = False, errors: int = 0,
              rejected: int = 0, last_error: str | None = None) -> WatcherStatus:
    return WatcherStatus(state=state, doc=doc_, key="azprobe/v1/weights", key_absent=absent, errors=errors,
                         rejected=rejected, ignored_older=0, callback_errors=0, last_error=last_error,
                         last_success_at=None)


def test_the_watchers_states_map_to_reasons() -> None:
    fresh = doc(DRAINED_C)
    assert usable_weights(status_of(WATCH_FRESH, doc_=fresh)).reason == FRESH
    held = usable_weights(status_of(WATCH_FRESH, doc_=fresh, absent=True))
    assert held.doc is fresh and held.held == "key absent"
    expired = doc(DRAINED_C, now=time.time() - 120)
    stale = usable_weights(status_of(STALE, doc_=expired))
    assert stale.doc is None and stale.reason == STALE_REASON and "expired (generation 7)" in stale.detail
    assert usable_weights(status_of(EMPTY, absent=True)).reason == ABSENT
    assert usable_weights(status_of(EMPTY, errors=3, last_error="refused")).reason == UNREACHABLE
    assert usable_weights(status_of(EMPTY, rejected=1, last_error="rejected document at k: x")).reason \
        == REJECTED
    assert usable_weights(status_of(EMPTY)).reason == WAITING


def test_a_document_landing_while_the_weights_are_read_gives_one_consistent_answer() -> None:
    # The real watcher; the fresh document arrives in the middle of the extender's read
    # of it (here from the watcher's own clock call, where its watch thread could land
    # it): the answer follows one state of the watcher, never a mix, never an exception.
    from azprobe.clients.consul import ConsulSettings, KeyState
    from azprobe.consumers.scheduler.server import WatcherSource
    from azprobe.consumers.watch import WeightWatcher

    t0 = time.time()
    landing: list[bytes] = []

    def clock() -> float:
        if landing:
            watcher._on_state(KeyState(index=3, value=landing.pop()))
        return now[0]

    now = [t0]
    watcher = WeightWatcher(ConsulSettings(), clock=clock)
    watcher._on_state(KeyState(index=2, value=doc(DRAINED_C, now=t0, ttl_s=60.0).dumps().encode()))
    now[0] = t0 + 61  # the held document expired; its leader's next one is on its way
    replacement = WeightsDoc(8, now[0], now[0] + 60, "ctl", "default", "degraded",
                             {az: zone(share, state) for az, (share, state) in HALF_B.items()})
    landing.append(replacement.dumps().encode())
    ext = Extender(WatcherSource(watcher), NodeZones(), max_nodes=100)
    first = ext.observe()
    assert first.doc is None and first.reason == STALE_REASON  # the state it read: the expired one
    second = ext.observe()
    assert second.reason == FRESH and second.doc is not None and second.doc.generation == 8


# --- bad input: 400 naming the problem --------------------------------------------------

BAD_BODIES = {
    b"": "not JSON",
    b"{": "not JSON",
    b"[]": "Expected `object`",
    b'{"NodeNames": [1]}': "$.NodeNames[0]",
    b'{"NodeNames": [""]}': "NodeNames[0]: empty node name",
    b'{"Nodes": {"items": [{"metadata": {"name": 5}}]}}': "Nodes.items[0]",
    b'{"Nodes": {"items": [{"metadata": {"name": "n", "labels": {"topology.kubernetes.io/zone": 1}}}]}}':
        "Nodes.items[0]",
    b'{"Nodes": {"items": [{"metadata": {"name": "n", "labels": ["a"]}}]}}': "Nodes.items[0]",
    b'{"Pod": null, "Nodes": null, "NodeNames": null}': "neither Nodes.items nor NodeNames",
    b'{"NodeNames": ["' + b"n" * 254 + b'"]}': "exceeds 253",
    b'{"NodeNames": ' + b"[" * 5000 + b"]" * 5000 + b"}": "$.NodeNames[0]",
    b'{"Pod": ' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b', "NodeNames": []}': "nested too deeply",
}


@pytest.mark.parametrize("body", BAD_BODIES, ids=range(len(BAD_BODIES)))
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_a_malformed_body_is_a_400_naming_what_is_wrong(verb: str, body: bytes) -> None:
    status, result = post(extender(doc(DRAINED_C)), verb, body)
    assert status == 400
    assert BAD_BODIES[body] in result["Error"]
    assert "\n" not in result["Error"]


def test_more_nodes_than_the_bound_is_a_400() -> None:
    body = extender_body(pod_object(), node_names=[f"n{i}" for i in range(101)])
    status, result = post(extender(doc(DRAINED_C)), "prioritize", body)
    assert status == 400 and "101 nodes, more than 100" in result["Error"]


def test_parse_args_keeps_request_order_and_zones() -> None:
    candidates = parse_args(extender_body(pod_object("p1"), NODES), max_nodes=10, node_zones=NodeZones())
    assert candidates.names == tuple(NAMES)
    assert candidates.zones == ("az-a", "az-b", "az-c", "az-c", None, "az-x")
    assert candidates.pod == "shop/p1"
    with pytest.raises(BadRequest):
        parse_args(b"null", max_nodes=10, node_zones=NodeZones())


# --- the property: a filter never leaves no node ----------------------------------------

zone_names = st.sampled_from(["az-a", "az-b", "az-c", "az-d", "zz"]) | st.none()
shares_docs = st.dictionaries(st.sampled_from(["az-a", "az-b", "az-c", "az-d"]),
                              st.sampled_from(["ok", "degraded", "shifted", "stale", "panic"]),
                              min_size=1, max_size=4)


@st.composite
def documents(draw: st.DrawFn) -> WeightsDoc | None:
    states = draw(shares_docs | st.none())
    if states is None:
        return None
    azs = sorted(states)
    cuts = sorted(draw(st.lists(st.integers(1, 99), min_size=len(azs) - 1, max_size=len(azs) - 1, unique=True)))
    bounds = [0, *cuts, 100]
    return doc({az: (bounds[i + 1] - bounds[i], states[az]) for i, az in enumerate(azs)})


@settings(max_examples=400, deadline=None)
@given(weights=documents(), node_zones=st.lists(zone_names, min_size=1, max_size=30))
def test_filter_returns_at_least_one_node_for_any_input(weights: WeightsDoc | None,
                                                        node_zones: list[str | None]) -> None:
    decision = scoring.filter_nodes(weights, node_zones)
    assert len(decision.kept) >= 1
    assert sorted(decision.kept + decision.removed) == list(range(len(node_zones)))
    assert all(node_zones[i] is not None for i in decision.removed)
    scores = scoring.prioritize(weights, node_zones)
    assert len(scores) == len(node_zones)
    assert all(scoring.MIN_EXTENDER_PRIORITY <= s <= scoring.MAX_EXTENDER_PRIORITY for s in scores)


@settings(max_examples=100, deadline=None)
@given(weights=documents(), node_zones=st.lists(zone_names, min_size=1, max_size=12))
def test_the_filter_over_http_answers_keep_at_least_one_node(weights: WeightsDoc | None,
                                                            node_zones: list[str | None]) -> None:
    nodes = [node_object(f"n{i}", az) for i, az in enumerate(node_zones)]
    status, result = post(extender(weights, ABSENT), "filter", extender_body(pod_object(), nodes))
    assert status == 200 and result["Error"] == ""
    assert len(result["Nodes"]["items"]) >= 1


def test_zone_scores_are_proportional_with_the_healthiest_at_ten() -> None:
    assert scoring.zone_scores(doc(HEALTHY)) == {"az-a": 10, "az-b": 10, "az-c": 10}
    assert scoring.zone_scores(doc(HALF_B)) == {"az-a": 10, "az-b": 5, "az-c": 10}
    assert scoring.zone_scores(doc(DRAINED_C)) == {"az-a": 10, "az-b": 10, "az-c": 0}
    assert scoring.zone_scores(None) == {}
