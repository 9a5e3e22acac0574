"""Which of two weights documents a reader keeps (azprobe.contracts.weights.is_newer):
by generation within one leader term, by generated_at across terms, never one from the
future (docs/contracts.md "Which document a reader keeps")."""

import json

import pytest

from azprobe.contracts.weights import MAX_CLOCK_SKEW_S, REJECTED, WeightsError, is_newer, parse_weights
from tests.helpers import sample_weights_doc
from tests.unit.test_weights_parser import make_doc

NOW = 1_700_000_000.0


def doc(generation, at=NOW, term=None, shares=None):
    return sample_weights_doc(generation, shares, now=at, term=term)


def test_within_one_term_the_generation_decides():
    held = doc(5, term="t1")
    assert is_newer(doc(6, at=NOW - 1, term="t1"), held, NOW)  # the writer's clock stepped back: still newer
    assert not is_newer(doc(4, at=NOW + 1, term="t1"), held, NOW)
    assert not is_newer(held, held, NOW) and is_newer(held, None, NOW)


def test_across_terms_or_without_one_the_later_document_decides():
    held = doc(5, term="t1")
    assert is_newer(doc(1, at=NOW + 1, term="t2"), held, NOW)  # a restarted numbering in a new term
    assert not is_newer(doc(9, at=NOW - 1, term="t2"), held, NOW)
    assert is_newer(doc(1, at=NOW + 1), doc(5), NOW)  # documents without a term
    assert not is_newer(doc(6, at=NOW - 1), doc(5), NOW)
    assert is_newer(doc(1, at=NOW + 1, term="t2"), doc(5), NOW)


def test_a_document_from_the_future_is_never_preferred():
    future = doc(2**52 + 1, at=9e10, term="forged")
    assert not is_newer(future, None, NOW) and not is_newer(future, doc(5, term="t1"), NOW)
    assert is_newer(doc(5, at=NOW + MAX_CLOCK_SKEW_S, term="t1"), None, NOW)  # within the skew bound
    assert not is_newer(doc(5, at=NOW + MAX_CLOCK_SKEW_S + 1, term="t1"), None, NOW)
    # a reader whose clock stepped back holds one: any present document replaces it
    assert is_newer(doc(1, at=NOW - 60, term="t2"), doc(7, at=NOW + 3600, term="t1"), NOW)
    assert is_newer(doc(1, at=NOW - 60, term="t1"), doc(7, at=NOW + 3600, term="t1"), NOW)


def test_the_issue_sequence_follows_the_restarted_term():
    held = doc(7, at=NOW - 5, term="t1")
    future = doc(2**52 + 1, at=9e10, term="forged")
    one = doc(1, at=NOW, term="t2")
    outage = doc(2, at=NOW + 1, term="t2", shares={"az-a": 99, "az-b": 1})
    for candidate in (future, one, outage):
        if is_newer(candidate, held, NOW + 1):
            held = candidate
    assert held == outage and held.zones["az-b"].share == 1


def test_readers_refuse_a_future_document_naming_generated_at_and_count_it():
    raw = json.dumps(make_doc(generation=2**52 + 1, generated_at=9e10, expires_at=9e10 + 90))
    before = REJECTED.value
    with pytest.raises(WeightsError, match=r"^generated_at: 90000000000\.0 is \d+ s ahead of this reader's clock"):
        parse_weights(raw, now=NOW)
    assert REJECTED.value == before + 1
    assert parse_weights(raw).generation == 2**52 + 1  # valid as a document: the writer may read it


def test_term_is_optional_bounded_and_round_trips():
    plain = parse_weights(json.dumps(make_doc()))
    assert plain.term is None and "term" not in json.loads(plain.dumps())
    termed = parse_weights(json.dumps(make_doc(term="0f3a9c2e4b5d6e7f")))
    assert termed.term == "0f3a9c2e4b5d6e7f" and parse_weights(termed.dumps()) == termed
    assert termed != plain


def test_a_fresh_document_replaces_an_expired_one_whatever_its_generation():
    # One document of the leader's term with an implausible generation: the leader's
    # real documents of that term are older by generation, but once it expires the next
    # fresh one is taken, not ignored until the term changes.
    forged = doc(2**53, at=NOW, term="t1")  # fresh for 60 s
    real = doc(105, at=NOW + 61, term="t1")
    assert not is_newer(doc(101, at=NOW + 30, term="t1"), forged, NOW + 30)  # while it is fresh it holds
    assert is_newer(real, forged, NOW + 61)
    assert not is_newer(doc(3, at=NOW - 30, term="t1"), forged, NOW + 61)  # an expired replay is not taken
    assert not is_newer(forged, real, NOW + 61)


def test_a_document_fresh_for_longer_than_max_ttl_is_refused():
    from azprobe.contracts.weights import MAX_TTL_S

    raw = json.dumps(make_doc(expires_at=make_doc()["generated_at"] + MAX_TTL_S + 1))
    before = REJECTED.value
    with pytest.raises(WeightsError, match=r"^expires_at: .* over the 604800 s a document may stay fresh"):
        parse_weights(raw)
    assert REJECTED.value == before + 1
