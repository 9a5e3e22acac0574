"""The JSON Schema file and the parser state the same contract: they agree on a corpus,
except for the rules JSON Schema cannot express (documented in the schema's description)."""

import json

import jsonschema
import pytest

from azprobe.contracts.weights import SCHEMA_PATH, WeightsError, parse_weights
from tests.unit.test_weights_parser import BAD, make_doc, with_zone

SCHEMA = json.loads(SCHEMA_PATH.read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)

# Rejected by the parser only: JSON Schema sees decoded values and cannot sum or compare.
PARSER_ONLY = {"share sum 101", "expires before generated", "fresh for years", "duplicate key", "NaN", "share float",
               "schema as float"}
# Not a JSON object the schema could be applied to at all.
UNDECODABLE = {"truncated", "empty", "binary", "samples 5000 digits", "deep nesting", "oversized"}


def test_schema_is_a_valid_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


GOOD = [
    make_doc(),
    make_doc(source_az="az-a", state="panic"),
    make_doc(term="0f3a9c2e4b5d6e7f"),
    with_zone(success=None, util=None, p95_ms=None, reasons=[]),
    make_doc(zones={"only": with_zone(share=100)["zones"]["az-a"]}),
    make_doc(zones={f"z{i}": with_zone(share=1 if i else 37)["zones"]["az-a"] for i in range(64)}),
]


@pytest.mark.parametrize("doc", GOOD)
def test_good_documents_pass_both(doc):
    VALIDATOR.validate(doc)
    parse_weights(json.dumps(doc))


@pytest.mark.parametrize("name,raw", [(n, r) for n, r, _ in BAD if n not in UNDECODABLE],
                         ids=[n for n, _, _ in BAD if n not in UNDECODABLE])
def test_bad_documents_agree(name, raw):
    with pytest.raises(WeightsError):
        parse_weights(raw)
    decoded = json.loads(raw)  # Python's lenient decoder: NaN, Infinity, duplicates pass
    schema_accepts = VALIDATOR.is_valid(decoded)
    if name in PARSER_ONLY:
        assert schema_accepts, f"{name}: the schema now catches it; move it out of PARSER_ONLY"
    else:
        assert not schema_accepts, f"{name}: the parser rejects it but the schema accepts it"
