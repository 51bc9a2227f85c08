"""The fast accept of plain input schemas never accepts what jsonschema refuses."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toolbus_contracts.errors import InvalidInput
from toolbus_dispatcher.schema_fast import fast_accept
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

NOT_PLAIN: list[dict[str, Any]] = [
    {"type": "object", "properties": {"d": {"type": "string", "format": "date"}}},
    {"type": "object", "properties": {"s": {"type": "string", "maxLength": 3}}},
    {"type": "object", "properties": {"r": {"$ref": "#/$defs/x"}}, "$defs": {"x": {"type": "string"}}},
    {"$schema": "http://json-schema.org/draft-03/schema#", "type": "object"},
    {"type": "object", "properties": {"e": {"enum": [1, True]}}},
    {"type": "object", "patternProperties": {"^a": {"type": "string"}}, "additionalProperties": False},
    {"type": "array", "items": [{"type": "string"}]},
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


@pytest.mark.parametrize("schema", PLAIN)
@settings(max_examples=300, deadline=None)
@given(value=json_values)
def test_fast_accept_never_accepts_what_jsonschema_refuses(schema: dict[str, Any], value: Any) -> None:
    accept = fast_accept(schema)
    assert accept is not None
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    if accept(value):
        assert cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(value), (schema, value)


def test_fast_accept_takes_common_valid_inputs() -> None:
    assert fast_accept(PLAIN[0])({"text": "hi"}) is True  # type: ignore[misc]
    assert fast_accept(PLAIN[1])({"n": 3, "tags": ["a"], "mode": "b", "maybe": None, "inner": {"k": "v"}})  # type: ignore[misc]


def test_schemas_with_other_keywords_have_no_fast_accept() -> None:
    for schema in NOT_PLAIN:
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
