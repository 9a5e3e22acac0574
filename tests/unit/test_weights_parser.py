"""The weights contract: every rule of docs/contracts.md "Weights document", one clear error naming the field."""

import json
import math

import pytest

from azprobe.contracts.weights import (MIN_WEIGHT, REJECTED, WeightsDoc, WeightsError, ZoneWeights,
                             parse_weights)


def make_doc(**overrides) -> dict:
    doc = {
        "schema": 1, "generation": 17, "generated_at": 1764470000.123, "expires_at": 1764470030.123,
        "source_az": None, "leader": "ctl-1", "model": "default", "state": "ok",
        "zones": {
            "az-a": {"weight": 1.0, "share": 85, "health": 0.98, "success": 0.9992, "p95_ms": 12.3,
                     "util": 0.4, "samples": 5000, "state": "ok", "reasons": ["health 0.98 >= 0.90: ok"]},
            "az-b": {"weight": 0.3, "share": 15, "health": 0.4, "success": None, "p95_ms": None,
                     "util": None, "samples": 0, "state": "degraded", "reasons": []},
        },
    }
    doc.update(overrides)
    return doc


def with_zone(**fields) -> dict:
    doc = make_doc()
    doc["zones"]["az-a"].update(fields)
    return doc


def test_valid_document_parses_and_round_trips():
    doc = parse_weights(json.dumps(make_doc()).encode())
    assert doc.generation == 17 and doc.zones["az-a"].share == 85
    assert doc.zones["az-b"].success is None
    assert doc.zones["az-a"].reasons == ("health 0.98 >= 0.90: ok",)
    again = parse_weights(doc.dumps())
    assert again == doc and again.dumps() == doc.dumps()


def test_dumps_is_compact_and_deterministic():
    a = parse_weights(json.dumps(make_doc()))
    reordered = make_doc()
    reordered["zones"] = dict(reversed(list(reordered["zones"].items())))
    b = parse_weights(json.dumps(reordered, indent=4))
    assert a.dumps() == b.dumps()
    assert " " not in a.dumps().replace("health 0.98 >= 0.90: ok", "")


def test_document_is_immutable():
    doc = parse_weights(json.dumps(make_doc()))
    with pytest.raises(AttributeError):
        doc.generation = 18  # type: ignore[misc]
    with pytest.raises(TypeError):
        doc.zones["az-c"] = doc.zones["az-a"]  # type: ignore[index]


def test_caller_dict_cannot_mutate_a_built_document():
    zones = {"a": ZoneWeights(1.0, 100, 1.0, 1.0, 1.0, 0.1, 5, "ok")}
    doc = WeightsDoc(generation=1, generated_at=1.0, expires_at=2.0, leader="l", model="m",
                     state="ok", zones=zones)
    zones["b"] = zones["a"]
    assert list(doc.zones) == ["a"]


def test_staleness_by_expires_at():
    doc = parse_weights(json.dumps(make_doc()))
    assert not doc.is_stale(now=1764470030.0)
    assert doc.is_stale(now=1764470030.123)
    assert doc.effective_state(now=1764470031) == "stale"
    assert doc.effective_state(now=1764470001) == "ok"
    assert doc.age_s(now=1764470010.123) == pytest.approx(10.0)


BAD = [
    ("truncated", json.dumps(make_doc())[:-7], r"not valid JSON"),
    ("empty", "", r"not valid JSON"),
    ("not an object", "[1, 2]", r"expected a JSON object"),
    ("binary", b"\xff\xfe\x00garbage", r"not UTF-8"),
    ("NaN", json.dumps(with_zone(health=float("nan"))), r"NaN is not allowed"),
    ("Infinity", json.dumps(with_zone(p95_ms=float("inf"))), r"Infinity is not allowed"),
    ("overflowing float", json.dumps(with_zone(p95_ms=1.0)).replace('"p95_ms": 1.0', '"p95_ms": 1e400'),
     r"zones\.az-a\.p95_ms: inf is not a finite"),
    ("unknown schema", json.dumps(make_doc(schema=2)), r"^schema: unsupported version 2"),
    ("schema as float", json.dumps(make_doc(schema=1.0)), r"^schema: unsupported version"),
    ("schema missing", json.dumps({k: v for k, v in make_doc().items() if k != "schema"}), r"^schema: is required"),
    ("unknown field", json.dumps(make_doc(extra=1)), r"^extra: unknown field"),
    ("unknown zone field", json.dumps(with_zone(colour="red")), r"zones\.az-a\.colour: unknown field"),
    ("missing zone field", json.dumps(make_doc(zones={"az-a": {"weight": 1.0}})), r"zones\.az-a\.share: is required"),
    ("zones empty", json.dumps(make_doc(zones={})), r"^zones: must not be empty"),
    ("zones list", json.dumps(make_doc(zones=[])), r"^zones: expected an object"),
    ("zone not object", json.dumps(make_doc(zones={"az-a": 5})), r"zones\.az-a: expected an object"),
    ("empty AZ name", json.dumps(make_doc(zones={"": make_doc()["zones"]["az-a"]})), r"^zones: must not be empty"),
    ("negative weight", json.dumps(with_zone(weight=-0.5)), r"zones\.az-a\.weight: -0.5 outside"),
    ("zero weight", json.dumps(with_zone(weight=0)), r"zones\.az-a\.weight: 0 outside"),
    ("weight above 1", json.dumps(with_zone(weight=1.5)), r"zones\.az-a\.weight"),
    ("weight string", json.dumps(with_zone(weight="1.0")), r"zones\.az-a\.weight: expected a number"),
    ("weight bool", json.dumps(with_zone(weight=True)), r"zones\.az-a\.weight: expected a number"),
    ("share sum 101", json.dumps(with_zone(share=86)), r"^zones: shares sum to 101"),
    ("share zero", json.dumps(with_zone(share=0)), r"zones\.az-a\.share: 0 outside 1\.\.100"),
    ("share negative", json.dumps(with_zone(share=-85)), r"zones\.az-a\.share"),
    ("share float", json.dumps(with_zone(share=85.0)), r"zones\.az-a\.share: expected an integer"),
    ("health above 1", json.dumps(with_zone(health=1.01)), r"zones\.az-a\.health"),
    ("success negative", json.dumps(with_zone(success=-0.1)), r"zones\.az-a\.success"),
    ("util as string", json.dumps(with_zone(util="high")), r"zones\.az-a\.util: expected a number or null"),
    ("p95 negative", json.dumps(with_zone(p95_ms=-1)), r"zones\.az-a\.p95_ms"),
    ("p95 huge", json.dumps(with_zone(p95_ms=1e30)), r"zones\.az-a\.p95_ms"),
    ("samples negative", json.dumps(with_zone(samples=-1)), r"zones\.az-a\.samples"),
    ("samples huge", json.dumps(with_zone(samples=2**60)), r"zones\.az-a\.samples"),
    ("samples 5000 digits", json.dumps(with_zone(samples=0)).replace('"samples": 0', '"samples": ' + "9" * 5000),
     r"not valid JSON|samples"),
    ("zone state unknown", json.dumps(with_zone(state="great")), r"zones\.az-a\.state: 'great' is not one of"),
    ("zone state list", json.dumps(with_zone(state=["ok"])), r"zones\.az-a\.state"),
    ("reasons string", json.dumps(with_zone(reasons="ok")), r"zones\.az-a\.reasons: expected a list"),
    ("reason not string", json.dumps(with_zone(reasons=[1])), r"zones\.az-a\.reasons\[0\]: expected a string"),
    ("reason too long", json.dumps(with_zone(reasons=["x" * 300])), r"zones\.az-a\.reasons\[0\]: string of 300"),
    ("too many reasons", json.dumps(with_zone(reasons=["x"] * 65)), r"zones\.az-a\.reasons: 65 reasons"),
    ("overall state", json.dumps(make_doc(state="shifted")), r"^state: 'shifted' is not one of"),
    ("generation zero", json.dumps(make_doc(generation=0)), r"^generation: 0 outside"),
    ("generation huge", json.dumps(make_doc(generation=2**53 + 1)), r"^generation"),
    ("generation float", json.dumps(make_doc(generation=17.5)), r"^generation: expected an integer"),
    ("expires before generated", json.dumps(make_doc(expires_at=1.0)), r"^expires_at: 1\.0 is before"),
    ("fresh for years", json.dumps(make_doc(expires_at=9e10)),
     r"^expires_at: \d+ s after generated_at, over the 604800 s a document may stay fresh; the writer's TTL"),
    ("timestamp huge", json.dumps(make_doc(generated_at=1e300)), r"^generated_at"),
    ("leader too long", json.dumps(make_doc(leader="l" * 257)), r"^leader: string of 257"),
    ("leader null", json.dumps(make_doc(leader=None)), r"^leader: expected a string"),
    ("source_az empty", json.dumps(make_doc(source_az="")), r"^source_az: must not be empty"),
    ("source_az number", json.dumps(make_doc(source_az=3)), r"^source_az: expected a string"),
    ("term empty", json.dumps(make_doc(term="")), r"^term: '' is empty"),
    ("term too long", json.dumps(make_doc(term="t" * 129)), r"^term: .* has 129 characters, at most 128"),
    ("term with a space", json.dumps(make_doc(term="a b")), r"^term: 'a b' contains ' '"),
    ("term number", json.dumps(make_doc(term=7)), r"^term: 7 is not a string"),
    ("term null", json.dumps(make_doc(term=None)), r"^term: None is not a string"),
    ("duplicate key", json.dumps(make_doc())[:-1] + ', "leader": "ctl-2"}', r"^leader: duplicate key"),
    ("too many zones", json.dumps(make_doc(zones={f"z{i}": with_zone(share=1)["zones"]["az-a"] for i in range(65)})),
     r"^zones: 65 zones exceed 64"),
    ("deep nesting", "[" * 100000 + "]" * 100000, r"nested too deeply|expected a JSON object"),
    ("oversized", b" " * (512 * 1024 + 1), r"exceeds"),
]


@pytest.mark.parametrize("raw,pattern", [(raw, pat) for _, raw, pat in BAD], ids=[name for name, _, _ in BAD])
def test_bad_documents_are_rejected_with_the_field_named_and_counted(raw, pattern):
    before = REJECTED.value
    with pytest.raises(WeightsError, match=pattern):
        parse_weights(raw)
    assert REJECTED.value == before + 1


def test_weight_bounds_allow_slack_at_e_minus_2():
    assert math.isclose(MIN_WEIGHT, 0.1353352832366127)
    parse_weights(json.dumps(with_zone(weight=MIN_WEIGHT - 5e-10)))
    with pytest.raises(WeightsError, match="weight"):
        parse_weights(json.dumps(with_zone(weight=MIN_WEIGHT - 1e-8)))
    parse_weights(json.dumps(with_zone(weight=1.0 + 5e-10)))


def test_construction_validates_so_a_writer_cannot_build_a_bad_document():
    zone = ZoneWeights(1.0, 100, 1.0, None, None, None, 0, "ok")
    with pytest.raises(WeightsError, match="^zones: shares sum to 50"):
        WeightsDoc(generation=1, generated_at=1.0, expires_at=2.0, leader="l", model="m", state="ok",
                   zones={"a": ZoneWeights(1.0, 50, 1.0, None, None, None, 0, "ok")})
    with pytest.raises(WeightsError, match="^weight: nan is not a finite"):
        ZoneWeights(float("nan"), 100, 1.0, None, None, None, 0, "ok")
    with pytest.raises(WeightsError, match="^zones: must not be empty"):
        WeightsDoc(generation=1, generated_at=1.0, expires_at=2.0, leader="l", model="m", state="ok", zones={})
    doc = WeightsDoc(generation=1, generated_at=1.0, expires_at=2.0, leader="l", model="m", state="ok",
                     zones={"a": zone}, source_az="az-a")
    assert parse_weights(doc.dumps()).source_az == "az-a"


def test_non_text_input_is_a_weights_error():
    with pytest.raises(WeightsError, match="expected bytes or str"):
        parse_weights(None)  # type: ignore[arg-type]


def test_a_lifetime_up_to_max_ttl_is_taken_and_the_controllers_longest_is_within_it():
    from azprobe.contracts.weights import MAX_TTL_S
    from azprobe.controller.publish import Publisher

    at = make_doc()["generated_at"]
    assert parse_weights(json.dumps(make_doc(expires_at=at + MAX_TTL_S))).expires_at == at + MAX_TTL_S
    # the controller config's maxima: heartbeat_s 86400, session_ttl_s 86400, lock_delay_s 60, interval_s 60
    longest = Publisher.expiry_for(heartbeat_s=86400.0, session_ttl_s=86400.0, lock_delay_s=60.0, interval_s=60.0)
    assert longest * 2 <= MAX_TTL_S


@pytest.mark.parametrize("doc", [
    {"x\nCRITICAL forged\n\x1b[2J" + "A" * 400_000: 1},
    make_doc(**{"k\x1b[2J\n" + "B" * 100_000: 1}),
    make_doc(zones={"az-\n\x1b" + "C" * 200: {"weight": 1.0}}),
])
def test_a_rejection_quoting_a_name_from_the_document_is_one_short_printable_line(doc):
    with pytest.raises(WeightsError) as exc:
        parse_weights(json.dumps(doc))
    text = str(exc.value)
    assert len(text) < 400 and text.isprintable() and text.isascii(), text[:200]
    assert "\\n" in text  # the newline is shown escaped, not dropped


def test_a_duplicate_key_is_quoted_printable_too():
    key = "k\n" + "D" * 10_000
    raw = '{"%s": 1, "%s": 2}' % (json.dumps(key)[1:-1], json.dumps(key)[1:-1])
    with pytest.raises(WeightsError, match="duplicate key") as exc:
        parse_weights(raw)
    assert len(str(exc.value)) < 200 and str(exc.value).isprintable()
