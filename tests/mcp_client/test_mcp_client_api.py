"""The public names of `toolbus_mcp_client` are what other packages import; keep them pinned."""

from __future__ import annotations

import dataclasses

import pytest
import toolbus_mcp_client
from toolbus_mcp_client import ToolResult


def test_exported_names() -> None:
    assert sorted(toolbus_mcp_client.__all__) == [
        "EgressCheck",
        "IDEMPOTENCY_HEADER",
        "IDEMPOTENCY_META_KEY",
        "LARGE_BODY",
        "McpConnection",
        "McpPool",
        "Reserve",
        "ToolResult",
    ]
    assert toolbus_mcp_client.IDEMPOTENCY_HEADER == "Idempotency-Key"
    assert toolbus_mcp_client.IDEMPOTENCY_META_KEY == "toolbus/idempotencyKey"


def test_tool_result_is_frozen_with_the_agreed_fields() -> None:
    result = ToolResult(is_error=False, structured_content={"a": 1}, content=[{"type": "text", "text": "x"}])
    assert [f.name for f in dataclasses.fields(ToolResult)] == ["is_error", "structured_content", "content"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.is_error = True  # type: ignore[misc]


def test_pool_refuses_a_size_below_one() -> None:
    with pytest.raises(ValueError, match="max_size"):
        toolbus_mcp_client.McpPool(max_size=0)
