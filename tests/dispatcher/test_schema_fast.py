"""The fast accept of input schemas (jsonschema-rs) never accepts what the judge (jsonschema with
RE2 patterns) refuses, and refusals keep the judge's error."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toolbus_common.schema_fast import fast_accept
from toolbus_contracts.errors import InvalidInput
from toolbus_dispatcher.validation import SchemaCache

PLAIN: list[dict[str, Any]] = [
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "description": "how many"},
            "x": {"type": "number"},
            "flag": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "mode": {"enum": ["a", "b"]},
            "maybe": {"type": ["string", "null"]},
            "inner": {
                "type": "object",
                "properties": {"k": {"type": "string"}},
                "additionalProperties": False,
            },
        },
        "required": ["n"],
        "additionalProperties": False,
    },
    {"type": "object", "additionalProperties": {"type": "integer"}},
    {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "object",
        "properties": {"i": {"type": "integer"}},
    },
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "properties": {}},
    {"type": "object"},
    {},
]

RICH: list[dict[str, Any]] = [
    {"type": "object", "properties": {"d": {"type": "string", "format": "date"}}},
    {"type": "object", "properties": {"text": {"type": "string", "pattern": "^\\d+$"}}},
    {"type": "object", "properties": {"text": {"type": "string", "pattern": "^[a-c]{1,2}$"}}},
    {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True, "maxItems": 2}}},
    {"type": "object", "properties": {"x": {"type": "number", "minimum": 0, "exclusiveMaximum": 1}}},
    {"type": "object", "properties": {"n": {"anyOf": [{"type": "integer"}, {"const": "a"}]}}},
    {"type": "object", "properties": {"s": {"type": "string", "maxLength": 3}}},
    {"type": "object", "properties": {"r": {"$ref": "#/$defs/x"}}, "$defs": {"x": {"type": "string"}}},
    {"type": "object", "properties": {"e": {"enum": [1, True]}}},
    {"type": "object", "patternProperties": {"^a": {"type": "string"}}, "additionalProperties": False},
    {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 0.5}}},
]

NO_FAST_ACCEPT: list[dict[str, Any]] = [
    {"$schema": "http://json-schema.org/draft-03/schema#", "type": "object"},
    {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(?=a)a+$"}}},  # lookaround
    {"type": "object", "properties": {"r": {"$ref": "https://example.com/schema.json"}}},  # never fetched
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["a", "b", "c", "text"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["text", "n", "x", "flag", "tags", "mode", "maybe", "inner", "k", "i"]),
            inner,
            max_size=4,
        )
    ),
    max_leaves=8,
)


@pytest.mark.parametrize("schema", PLAIN + RICH)
@settings(max_examples=300, deadline=None)
@given(value=json_values)
def test_fast_accept_never_accepts_what_jsonschema_refuses(schema: dict[str, Any], value: Any) -> None:
    accept = fast_accept(schema)
    assert accept is not None
    judge = SchemaCache().validator("ts", "t", schema)  # the dispatcher's: RE2 patterns, formats
    assert judge is not None
    if accept(value):
        assert judge.is_valid(value), (schema, value)


def test_a_digit_pattern_takes_ascii_digits_only_as_re2_does() -> None:
    accept = fast_accept(RICH[1])
    assert accept is not None
    assert accept({"text": "123"}) is True
    assert accept({"text": "\u0661\u0662"}) is False  # Arabic-Indic digits: \\d is ASCII in ECMA and RE2


def test_fast_accept_takes_common_valid_inputs() -> None:
    assert fast_accept(PLAIN[0])({"text": "hi"}) is True  # type: ignore[misc]
    assert fast_accept(PLAIN[1])({"n": 3, "tags": ["a"], "mode": "b", "maybe": None, "inner": {"k": "v"}})  # type: ignore[misc]


def test_schemas_it_cannot_take_safely_have_no_fast_accept() -> None:
    for schema in NO_FAST_ACCEPT:
        assert fast_accept(schema) is None, schema


@pytest.mark.parametrize(
    ("value", "path"),
    [({}, "$.text"), ({"text": 1}, "$.text"), ({"text": "x", "more": 1}, "$")],
)
def test_refused_values_still_get_the_validators_error(value: dict[str, Any], path: str) -> None:
    schema = {**PLAIN[0], "additionalProperties": False}
    with pytest.raises(InvalidInput) as err:
        SchemaCache().check("ts", "t", schema, value)
    assert err.value.details["path"] == path
