"""The scheduling drill's placer and figures, pure: spread when the extender scores all
zones alike, none in a zone the extender filtered, failures counted."""

from __future__ import annotations

from azprobe.dev.drill.scheduler import Placement, Placer, phase_figures, stale_drained_doc


class FakeExtender(Placer):
    """The placer with the extender's answers given, not fetched over HTTP."""

    def __init__(self, drained: set[str], error: str = "") -> None:
        super().__init__("127.0.0.1", 1, ["az-a", "az-b", "az-c"], 3, rate=10)
        self.drained, self.error = drained, error

    def _post(self, verb: str, body: bytes):  # type: ignore[override]
        import json

        args = json.loads(body)
        items = args["Nodes"]["items"]
        zone = lambda n: n["metadata"]["labels"]["topology.kubernetes.io/zone"]  # noqa: E731
        if verb == "filter":
            return {"Nodes": {"items": [n for n in items if zone(n) not in self.drained]}, "Error": self.error}
        return [{"Host": n["metadata"]["name"], "Score": 10} for n in items]


def test_equal_scores_spread_evenly_and_a_filtered_zone_gets_nothing() -> None:
    placer = FakeExtender(set())
    even = [placer.place_one(i) for i in range(90)]
    assert {az: sum(p.az == az for p in even) for az in ("az-a", "az-b", "az-c")} == \
        {"az-a": 30, "az-b": 30, "az-c": 30}
    placer.drained = {"az-b"}
    drained = [placer.place_one(i) for i in range(60)]
    assert not any(p.az == "az-b" for p in drained) and not any(p.failed for p in drained)


def test_a_filter_error_is_a_failed_placement() -> None:
    placement = FakeExtender(set(), error="boom").place_one(0)
    assert placement.failed and placement.az is None


def test_phase_figures_count_shares_and_failures() -> None:
    placements = [Placement(0, "az-a", False, False), Placement(0, "az-b", False, False),
                  Placement(0, None, True, False), Placement(0, None, False, True)]
    figures = phase_figures("x", placements, ["az-b"], ["az-a", "az-b", "az-c"])
    assert (figures.pods, figures.failed, figures.ignored, figures.sick_share_pct) == (4, 1, 1, 50.0)


def test_the_stale_document_is_expired_and_drains_the_sick_zone() -> None:
    doc = stale_drained_doc(["az-a", "az-b", "az-c"], ["az-b"])
    assert doc.is_stale() and doc.zones["az-b"].share == 1 and doc.zones["az-b"].state == "degraded"
