"""Schemas nested deeper than `SCHEMA_DEPTH_MAX` are never walked by `jsonschema` (which would
exhaust Python's stack), and an input too deep for its recursive schema is `invalidInput`."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from toolbus_contracts.base import SCHEMA_DEPTH_MAX, nesting_depth
from toolbus_contracts.errors import InvalidInput
from toolbus_dispatcher.validation import SchemaCache


def nested(depth: int, leaf: Any = None) -> Any:
    value: Any = {} if leaf is None else leaf
    for _ in range(depth - 1 if leaf is None else depth):
        value = {"items": value} if leaf is None else [value]
    return value


def test_nesting_depth_counts_objects_and_arrays_without_recursion() -> None:
    shapes: tuple[Any, ...] = (
        1,
        "x",
        None,
        {},
        [],
        {"a": 1},
        [[]],
        {"a": [{"b": {}}]},
        {"a": 1, "b": {"c": [1, {"d": []}]}},
    )
    assert [nesting_depth(v) for v in shapes] == [0, 0, 0, 1, 1, 1, 2, 4, 5]
    assert nesting_depth(nested(SCHEMA_DEPTH_MAX)) == SCHEMA_DEPTH_MAX
    # far deeper than the stack allows; counting stops one past the limit
    assert nesting_depth(nested(5000)) == SCHEMA_DEPTH_MAX + 1
    assert nesting_depth(nested(5000), stop=10_000) == 5000


def test_a_pinned_schema_too_deep_to_check_is_not_enforced(caplog: pytest.LogCaptureFixture) -> None:
    schema = {"type": "object", "properties": {"a": nested(300)}}
    with caplog.at_level(logging.WARNING):
        SchemaCache().check("ts_1", "deep", schema, {"a": "anything"})
    assert "too deep" in caplog.text and len(caplog.text) < 2000  # no traceback


def test_an_input_too_deep_for_its_recursive_schema_is_invalid_input() -> None:
    tree = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/t"}},
        "$defs": {"t": {"type": ["array", "integer"], "items": {"$ref": "#/$defs/t"}}},
    }
    cache = SchemaCache()
    cache.check("ts_1", "tree", tree, {"a": nested(30, 1)})

    def deep_in_the_stack(frames: int) -> None:  # a handler runs below many frames already
        if frames:
            deep_in_the_stack(frames - 1)
        else:
            cache.check("ts_1", "tree", tree, {"a": nested(195, "x")})

    with pytest.raises(InvalidInput) as caught:
        deep_in_the_stack(400)
    assert caught.value.details["tool"] == "tree"
