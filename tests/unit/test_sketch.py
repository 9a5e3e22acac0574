import random

import pytest
from hypothesis import given, strategies as st

from azprobe.contracts.sketch import (
    NUM_BUCKETS,
    Histogram,
    bucket_index,
    bucket_lower_bound,
    bucket_width,
)


def test_small_values_are_exact():
    for v in range(16):
        assert bucket_lower_bound(bucket_index(v)) == v


def test_index_fits_and_is_monotonic():
    prev = -1
    for v in list(range(0, 5000)) + [2**20, 2**33, 2**34 - 1, 2**40]:
        i = bucket_index(v)
        assert 0 <= i < NUM_BUCKETS
        assert i >= prev or v > 2**34
        prev = i


@given(st.integers(min_value=0, max_value=2**34 - 1))
def test_value_inside_its_bucket(v):
    lower = bucket_lower_bound(bucket_index(v))
    assert lower <= v < lower + bucket_width(lower)
    if lower >= 16:
        assert bucket_width(lower) / lower <= 1 / 16


def test_quantile_relative_error_under_6_percent():
    rng = random.Random(7)
    values = sorted(int(rng.lognormvariate(10, 1)) for _ in range(20000))
    h = Histogram()
    for v in values:
        h.record(v)
    for q in (0.5, 0.9, 0.95, 0.99):
        exact = values[int(q * len(values)) - 1]
        assert abs(h.quantile(q) - exact) / exact < 0.0625


def test_merge_adds_counts_and_roundtrips_json():
    a, b = Histogram(), Histogram()
    a.record(100, 3)
    b.record(100, 2)
    b.record(5000)
    a.merge(b)
    assert a.total == 6
    assert Histogram.from_json(a.to_json()).counts == a.counts


def test_empty_quantile_is_none():
    assert Histogram().quantile(0.95) is None


@pytest.mark.parametrize("bad", [{"counts": {"x": 1}}, {"counts": {"5": -1}}, {"counts": []}, [], {"counts": {"5": 1.5}}])
def test_from_json_rejects_garbage(bad):
    with pytest.raises(ValueError):
        Histogram.from_json(bad)


def test_subtract_takes_back_a_merge_and_drops_emptied_buckets():
    total, part = Histogram(), Histogram()
    for value, n in ((900, 5), (12_000, 7)):
        total.record(value, n)
    part.record(12_000, 7)
    before = dict(total.counts)
    total.merge(part)
    total.subtract(part)
    assert total.counts == before
    total.subtract(part)
    assert total.counts == {bucket_lower_bound(bucket_index(900)): 5}  # 12 ms's bucket reached 0: gone
