"""The MCP client's answer cap (`max_body`) on both fast-path HTTP stacks (the lean HTTP/1.1 pool
and httpx2) and both answer forms (JSON and SSE), against a real MCP server: an answer over the cap
is `OutputTooLarge` and reading stops there; the connection stays usable for the next call."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from toolbus_contracts.errors import OutputTooLarge
from toolbus_mcp_client import McpConnection

from tests.support.mcp_servers import McpTestServer, echo_server

pytestmark = pytest.mark.integration

CAP = 100_000


@pytest.fixture(params=[False, True], ids=["sse", "json"])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[McpTestServer]:
    async with echo_server(name="caps", json_response=request.param) as srv:
        yield srv


@pytest.mark.parametrize("stack", ["lean", "httpx2"])
async def test_answers_over_the_cap_are_output_too_large_on_both_stacks(
    server: McpTestServer, stack: str
) -> None:
    conn = await McpConnection.open(server.url, {}, server_name="caps", max_body=CAP)
    try:
        if stack == "httpx2":
            conn._lean = None  # every POST through httpx2 (as for a redirecting server)
        small = await conn.call_tool(
            "echo", {"text": "a" * 1000}, idempotency_key=uuid.uuid4().hex, timeout=30
        )
        assert small.structured_content == {"text": "a" * 1000}
        with pytest.raises(OutputTooLarge) as err:
            await conn.call_tool("echo", {"text": "b" * CAP}, idempotency_key=uuid.uuid4().hex, timeout=30)
        assert err.value.details["limit"] == CAP and not err.value.retryable
        again = await conn.call_tool("echo", {"text": "c"}, idempotency_key=uuid.uuid4().hex, timeout=30)
        assert again.structured_content == {"text": "c"}
    finally:
        await conn.aclose()
