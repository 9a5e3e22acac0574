"""Property tests on the weights parser: arbitrary input never raises anything but
WeightsError; every valid generated document round-trips and satisfies the schema."""

import json
import math

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from azprobe.contracts.weights import (MAX_TTL_S, MIN_WEIGHT, OVERALL_STATES, REJECTED, SCHEMA_PATH, ZONE_STATES,
                             WeightsDoc, WeightsError, ZoneWeights, parse_weights)

VALIDATOR = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=30,
)


def _parse_or_weights_error(raw) -> None:
    try:
        parse_weights(raw)
    except WeightsError:
        pass


@FAST
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_raise_only_weights_error(raw):
    _parse_or_weights_error(raw)


@FAST
@given(json_values)
def test_arbitrary_json_raises_only_weights_error(value):
    _parse_or_weights_error(json.dumps(value))


def shares_summing_to_100(n: int) -> st.SearchStrategy[list[int]]:
    # n-1 distinct cut points in 1..99 split 100 into n parts, each >= 1.
    return st.lists(st.integers(1, 99), min_size=n - 1, max_size=n - 1, unique=True).map(
        lambda cuts: [b - a for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), 100])])


unit = st.floats(0.0, 1.0, allow_nan=False)
optional_unit = st.none() | unit


@st.composite
def weights_docs(draw) -> WeightsDoc:
    n = draw(st.integers(1, 8))
    names = draw(st.lists(st.text(min_size=1, max_size=12), min_size=n, max_size=n, unique=True))
    shares = draw(shares_summing_to_100(n))
    zones = {
        name: ZoneWeights(
            weight=draw(st.floats(MIN_WEIGHT, 1.0)), share=share, health=draw(unit),
            success=draw(optional_unit), p95_ms=draw(st.none() | st.floats(0, 1e6)),
            util=draw(optional_unit), samples=draw(st.integers(0, 2**53)),
            state=draw(st.sampled_from(sorted(ZONE_STATES))),
            reasons=tuple(draw(st.lists(st.text(max_size=40), max_size=4))))
        for name, share in zip(names, shares)
    }
    generated = draw(st.floats(0, 4e9))
    return WeightsDoc(generation=draw(st.integers(1, 2**53)), generated_at=generated,
                      expires_at=generated + draw(st.floats(0, MAX_TTL_S)), leader=draw(st.text(max_size=20)),
                      model=draw(st.text(max_size=20)), state=draw(st.sampled_from(sorted(OVERALL_STATES))),
                      zones=zones, source_az=draw(st.none() | st.text(min_size=1, max_size=12)))


@FAST
@given(weights_docs())
def test_valid_documents_round_trip_and_match_the_schema(doc):
    text = doc.dumps()
    again = parse_weights(text)
    assert again == doc
    assert again.dumps() == text
    assert sum(z.share for z in again.zones.values()) == 100
    VALIDATOR.validate(json.loads(text))


@FAST
@given(weights_docs(), st.sampled_from(["weight", "health", "share", "samples"]),
       st.sampled_from([-1, float("nan"), float("inf"), 10**30, "x", None, [], True]))
def test_corrupting_one_zone_field_is_rejected_and_counted(doc, field_name, bad_value):
    data = doc.to_json()
    az = sorted(data["zones"])[0]
    data["zones"][az][field_name] = bad_value
    before = REJECTED.value
    try:
        parse_weights(json.dumps(data))
    except WeightsError as exc:
        assert field_name in str(exc) or "NaN" in str(exc) or "Infinity" in str(exc)
        assert REJECTED.value == before + 1
    else:
        raise AssertionError(f"accepted {field_name}={bad_value!r}")


def test_min_weight_is_e_to_the_minus_2():
    assert math.isclose(MIN_WEIGHT, math.exp(-2))
