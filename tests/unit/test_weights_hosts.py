"""The sick-hosts document (azprobe.contracts.weights_hosts): round trip, bounds, and
that the weights document beside it is unchanged for its readers."""

from __future__ import annotations

import json

import pytest

from azprobe.contracts.weights import REJECTED, WeightsError, is_newer
from azprobe.contracts.weights_hosts import (MAX_DOC_SICK_HOSTS, MAX_ZONE_SICK_HOSTS, HostsDoc, SickHostEntry,
                                             parse_hosts)


def doc(global_view=None, from_views=None, generation=3, term="t1", at=100.0) -> HostsDoc:
    return HostsDoc(generation=generation, generated_at=at, expires_at=at + 90, term=term,
                    global_view=global_view if global_view is not None else
                    {"az-b": (SickHostEntry("198.18.2.12", ("host quorum: 9 of 9 nodes",)),
                              SickHostEntry("2001:2:0:120::102", ()))},
                    from_views=from_views if from_views is not None else
                    {"az-a": {"az-b": (SickHostEntry("198.18.2.12", ("seen from az-a",)),)}})


def test_round_trip_and_views():
    d = doc()
    back = parse_hosts(d.dumps(), now=101.0)
    assert back == d and back.dumps() == d.dumps()
    assert [h.addr for h in back.sick()["az-b"]] == ["198.18.2.12", "2001:2:0:120::102"]  # worst first, kept
    assert back.sick("az-a")["az-b"][0].reasons == ("seen from az-a",)
    assert back.sick("az-c") == back.sick()  # a view without its own: the global one
    assert not back.is_stale(150.0) and back.is_stale(190.0)


def test_ordered_like_a_weights_document():
    old, new = doc(generation=3), doc(generation=4)
    assert is_newer(new, old, 101.0) and not is_newer(old, new, 101.0)
    other_term = doc(generation=1, term="t2", at=100.5)
    assert is_newer(other_term, new, 101.0)


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d["global"]["az-b"][0].update(addr="198.018.2.1"), "global.az-b[0].addr"),
    (lambda d: d["global"]["az-b"][0].update(addr="2001:0002::1"), "global.az-b[0].addr"),
    (lambda d: d["global"]["az-b"][0].update(extra=1), "global.az-b[0]"),
    (lambda d: d["global"]["az-b"][0].update(reasons=["x"] * 5), "global.az-b[0].reasons"),
    (lambda d: d["global"]["az-b"][0].update(reasons=["x" * 257]), "global.az-b[0].reasons[0]"),
    (lambda d: d["global"]["az-b"].append(dict(d["global"]["az-b"][0])), "global.az-b"),
    (lambda d: d["global"].update({"az b": []}), "global"),
    (lambda d: d.update(schema=2), "schema"),
    (lambda d: d.update(surprise=True), "surprise"),
    (lambda d: d.pop("from"), "from"),
    (lambda d: d.update(expires_at=1.0), "expires_at"),
    (lambda d: d["global"].update({"az-c": [{"addr": f"198.18.3.{i}", "reasons": []}
                                            for i in range(MAX_ZONE_SICK_HOSTS + 1)]}), "global.az-c"),
])
def test_a_broken_document_is_refused_naming_the_field(mutate, field):
    raw = json.loads(doc().dumps())
    mutate(raw)
    before = REJECTED.value
    with pytest.raises(WeightsError) as exc:
        parse_hosts(json.dumps(raw))
    assert exc.value.field.startswith(field), exc.value
    assert REJECTED.value == before + 1


def test_the_whole_document_is_bounded():
    views = {f"az-{i}": {"az-b": tuple(SickHostEntry(f"198.18.{i}.{j}") for j in range(MAX_ZONE_SICK_HOSTS))}
             for i in range(MAX_DOC_SICK_HOSTS // MAX_ZONE_SICK_HOSTS + 1)}
    with pytest.raises(WeightsError, match="exceed"):
        doc(global_view={}, from_views=views)


def test_from_the_future_is_refused():
    with pytest.raises(WeightsError, match="future"):
        parse_hosts(doc(at=1000.0).dumps(), now=100.0)


def test_the_publisher_bounds_the_document_and_never_lets_it_block_the_weights():
    from azprobe.clients.consul import ConsulSettings
    from azprobe.contracts.weights import ZoneWeights
    from azprobe.controller.publish import GLOBAL_VIEW, Publisher, WeightsView

    zones = {"az-a": ZoneWeights(1.0, 50, 1.0, 1.0, 1.0, 0.3, 100, "ok"),
             "az-b": ZoneWeights(1.0, 50, 1.0, 1.0, 1.0, 0.3, 100, "ok")}
    many = tuple(SickHostEntry(f"198.18.2.{i}", ("r" * 256,) * 4) for i in range(MAX_ZONE_SICK_HOSTS + 9))
    views = {GLOBAL_VIEW: WeightsView("ok", zones, sick={"az-b": many})}
    views.update({f"az-{c}": WeightsView("ok", zones, source_az=f"az-{c}", sick={"az-b": many, "az-a": many})
                  for c in "abcdefgh"})
    publisher = Publisher(None, ConsulSettings(), leader_name="ctl", model_name="default")  # type: ignore[arg-type]
    doc = publisher.build_hosts(views, 1, 100.0)
    assert len(doc.global_view["az-b"]) == MAX_ZONE_SICK_HOSTS  # the worst, kept first
    total = sum(len(h) for v in (doc.global_view, *doc.from_views.values()) for h in v.values())
    assert total == MAX_DOC_SICK_HOSTS and parse_hosts(doc.dumps()) == doc
    # nothing named and nothing in KV to replace: no document, the KV output as before
    assert publisher.build_hosts({GLOBAL_VIEW: WeightsView("ok", zones)}, 2, 101.0) is None


def test_a_duplicate_key_is_refused_as_in_a_weights_document():
    # Two "global" views: a parser keeping the last would demote other hosts than one
    # keeping the first; the document is refused instead, and counted.
    raw = doc().dumps()
    dup = raw[:-1] + ',"global":{"az-a":[{"addr":"198.18.1.99","reasons":["other"]}]}}'
    before = REJECTED.value
    with pytest.raises(WeightsError, match="^global: duplicate key"):
        parse_hosts(dup, now=101.0)
    assert REJECTED.value == before + 1
    with pytest.raises(WeightsError, match="NaN is not allowed"):
        parse_hosts(raw.replace('"generated_at":100.0', '"generated_at":NaN'), now=101.0)


def test_a_hosts_document_is_fresh_at_most_max_ttl():
    from azprobe.contracts.weights import MAX_TTL_S

    raw = json.loads(doc().dumps())
    raw["expires_at"] = raw["generated_at"] + MAX_TTL_S + 1
    with pytest.raises(WeightsError, match="^expires_at: .* may stay fresh"):
        parse_hosts(json.dumps(raw), now=101.0)


def test_a_name_from_the_document_is_quoted_on_one_short_line():
    raw = json.loads(doc().dumps())
    raw["x\n\x1b[2J" + "A" * 100_000] = 1
    with pytest.raises(WeightsError, match="unknown field") as exc:
        parse_hosts(json.dumps(raw), now=101.0)
    assert len(str(exc.value)) < 300 and str(exc.value).isprintable()
    raw = json.loads(doc().dumps())
    raw["global"]["az\n" + "B" * 100_000] = 5
    with pytest.raises(WeightsError, match="expected a list") as exc:
        parse_hosts(json.dumps(raw), now=101.0)
    assert len(str(exc.value)) < 300 and str(exc.value).isprintable()
