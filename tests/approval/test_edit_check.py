"""An edited input is checked as the dispatcher checks a call's input (`toolbus_common.input_schemas`):
RE2 patterns, so no edit can make the approval service backtrack; a refusal names `input`."""

from __future__ import annotations

from typing import Any

import pytest
from toolbus_approval.edits import EditCheck
from toolbus_contracts.errors import InvalidRequest

SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("ts_1", "refund"): {
        "type": "object",
        "properties": {"charge": {"type": "string", "pattern": "^(a+)+$"}, "amount": {"type": "integer"}},
        "required": ["charge", "amount"],
    },
    ("ts_1", "lookahead"): {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^(?=x)x+$"}},
    },
}


class PinnedSchemas:
    """The tools' pinned input schemas, as the toolsets store would give them."""

    async def input_schema(self, toolset_id: str, tool: str) -> dict[str, Any] | None:
        return SCHEMAS.get((toolset_id, tool))


async def test_an_edit_the_schema_accepts_passes() -> None:
    await EditCheck(PinnedSchemas()).check("ts_1", "refund", {"charge": "aaa", "amount": 5})


async def test_a_catastrophic_pattern_is_matched_by_re2_and_the_edit_refused_naming_the_path() -> None:
    with pytest.raises(InvalidRequest) as caught:
        await EditCheck(PinnedSchemas()).check("ts_1", "refund", {"charge": "a" * 40 + "!", "amount": 5})
    assert caught.value.details == {"field": "input", "path": "$.charge"}
    assert str(caught.value).startswith("Field 'input' of 'refund' is invalid at '$.charge'")


async def test_a_missing_property_is_named() -> None:
    with pytest.raises(InvalidRequest) as caught:
        await EditCheck(PinnedSchemas()).check("ts_1", "refund", {"charge": "a"})
    assert caught.value.details == {"field": "input", "path": "$.amount"}


async def test_a_pattern_re2_cannot_run_is_still_enforced() -> None:
    check = EditCheck(PinnedSchemas())
    await check.check("ts_1", "lookahead", {"code": "xx"})
    with pytest.raises(InvalidRequest) as caught:
        await check.check("ts_1", "lookahead", {"code": "yx"})
    assert caught.value.details == {"field": "input", "path": "$.code"}


async def test_a_tool_no_longer_stored_cannot_be_edited() -> None:
    with pytest.raises(InvalidRequest) as caught:
        await EditCheck(PinnedSchemas()).check("ts_1", "gone", {})
    assert caught.value.details == {"field": "input"}
