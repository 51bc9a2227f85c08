"""`McpConnection` against the npm reference server `@modelcontextprotocol/server-everything`
(streamable HTTP, protocol 2025-11-25, sessions); `make npm-tools` installs it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from toolbus_contracts.errors import OutputTooLarge
from toolbus_mcp_client import McpConnection

from tests.support.everything_server import everything_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def everything_url() -> AsyncIterator[str]:
    async with everything_server() as url:
        yield url


async def test_falls_back_to_2025_sessions_lists_and_calls(everything_url: str) -> None:
    conn = await McpConnection.open(everything_url, {"X-Trace": "t1"}, server_name="everything")
    try:
        assert conn.protocol_version == "2025-11-25"
        tools = {t["name"]: t for t in await conn.list_tools()}
        assert {"echo", "get-sum", "get-structured-content"} <= set(tools)
        assert tools["echo"]["inputSchema"]["properties"]["message"]["type"] == "string"
        results = await asyncio.gather(
            *(
                conn.call_tool("echo", {"message": f"m{i}"}, idempotency_key=uuid.uuid4().hex, timeout=10)
                for i in range(8)
            )
        )
        assert [r.content for r in results] == [[{"type": "text", "text": f"Echo: m{i}"}] for i in range(8)]
        assert not any(r.is_error for r in results)
    finally:
        await conn.aclose()


async def test_structured_content_and_unknown_tool_as_error_result(everything_url: str) -> None:
    conn = await McpConnection.open(everything_url, {}, server_name="everything")
    try:
        result = await conn.call_tool(
            "get-structured-content", {"location": "New York"}, idempotency_key="k", timeout=10
        )
        assert isinstance(result.structured_content, dict)
        assert "temperature" in result.structured_content
        # This server reports an unknown tool as an isError result, which is a result, not a failure.
        unknown = await conn.call_tool("no-such-tool", {}, idempotency_key="k2", timeout=10)
        assert unknown.is_error is True
        assert "no-such-tool" in unknown.content[0]["text"]
    finally:
        await conn.aclose()


async def test_answers_over_the_cap_are_output_too_large_on_a_2025_session(everything_url: str) -> None:
    # A 2025-11-25 session goes through the MCP SDK's transport, which reads whole bodies: the
    # client's transport stops each answer at the cap. (This server answers as SSE.)
    conn = await McpConnection.open(everything_url, {}, server_name="everything", max_body=20_000)
    try:
        assert conn.protocol_version == "2025-11-25"
        with pytest.raises(OutputTooLarge) as err:
            await conn.call_tool(
                "echo", {"message": "x" * 30_000}, idempotency_key=uuid.uuid4().hex, timeout=10
            )
        assert err.value.details["limit"] == 20_000 and not err.value.retryable
        small = await conn.call_tool("echo", {"message": "y"}, idempotency_key=uuid.uuid4().hex, timeout=10)
        assert small.content == [{"type": "text", "text": "Echo: y"}]
    finally:
        await conn.aclose()
