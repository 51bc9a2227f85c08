"""The MCP client's answer cap (`max_body`) on every HTTP path, against real MCP servers over
streamable HTTP: the fast path's two stacks (the lean HTTP/1.1 pool and httpx2), and the MCP SDK's
own transport (a 2026 connection with `fast_calls=False`, and a 2025-11-25 session with a server
that only speaks the 2025 protocol), each with JSON and SSE answers. An answer over the cap is
`OutputTooLarge` (not retryable) and reading stops there: the bytes taken off the network stay
within the cap plus one read, for an answer 50 times the cap; the connection stays usable for
the next call."""

from __future__ import annotations

import tracemalloc
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from toolbus_contracts.errors import OutputTooLarge
from toolbus_mcp_client import McpConnection

from tests.support.mcp_servers import Fault, McpTestServer, echo_handler, echo_tools

pytestmark = pytest.mark.integration

CAP = 100_000
HUGE = 50 * CAP
ONE_READ = 256 * 1024  # more than any single network read hands over
TOOLS = [
    *echo_tools(),
    {"name": "repeat", "description": "n times the letter", "inputSchema": {"type": "object"}},
]


async def handler(name: str, arguments: dict[str, Any]) -> Any:
    if name == "repeat":
        return {"text": str(arguments["letter"]) * int(arguments["n"])}
    return await echo_handler(name, arguments)


class _Counting(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, counter: list[int]) -> None:
        self._inner = inner
        self._counter = counter

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._counter[-1] += len(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class CountingTransport(httpx2.AsyncBaseTransport):
    """Below the client's own transport: counts the body bytes read off the network per answer."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner
        self.read: list[int] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        self.read.append(0)
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        response.stream = _Counting(response.stream, self.read)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


@pytest.fixture(params=[False, True], ids=["sse", "json"])
def json_response(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.mark.parametrize("stack", ["lean", "httpx2", "sdk", "session"])
async def test_answers_over_the_cap_are_output_too_large_on_every_path(
    json_response: bool, stack: str
) -> None:
    async with McpTestServer(
        TOOLS, handler, name="caps", json_response=json_response, legacy=stack == "session"
    ) as server:
        conn = await McpConnection.open(
            server.url, {}, server_name="caps", max_body=CAP, fast_calls=stack in ("lean", "httpx2")
        )
        counting = CountingTransport(conn._http._transport._inner)  # type: ignore[attr-defined]
        conn._http._transport._inner = counting  # type: ignore[attr-defined]
        try:
            assert conn.protocol_version == ("2025-11-25" if stack == "session" else "2026-07-28")
            if stack != "lean":
                conn._lean = None  # every POST through httpx2 (as for a redirecting server)
            small = await conn.call_tool(
                "echo", {"text": "a" * 1000}, idempotency_key=uuid.uuid4().hex, timeout=30
            )
            assert small.structured_content == {"text": "a" * 1000}
            with pytest.raises(OutputTooLarge) as err:
                await conn.call_tool(
                    "repeat", {"letter": "b", "n": HUGE}, idempotency_key=uuid.uuid4().hex, timeout=30
                )
            assert err.value.details["limit"] == CAP and not err.value.retryable
            if (
                stack != "lean"
            ):  # the lean pool reads its own sockets (tests/mcp_client/test_mcp_client_http1.py)
                assert counting.read and max(counting.read) <= CAP + ONE_READ, counting.read
            again = await conn.call_tool("echo", {"text": "c"}, idempotency_key=uuid.uuid4().hex, timeout=30)
            assert again.structured_content == {"text": "c"}
        finally:
            await conn.aclose()
    assert (server.initializations > 0) == (stack == "session")


@pytest.mark.parametrize("stack", ["httpx2", "sdk", "session"])
async def test_a_compressed_answer_is_decoded_within_the_cap_on_the_httpx2_paths(stack: str) -> None:
    """httpx2 would inflate each network read whole (a 64 KiB read of a gzip bomb is 64 MiB) before
    the cap looks at it: the transport decodes instead, at most one byte past the cap. A small
    gzip answer decodes as it should; a 100 MB one (~100 KB on the wire) is `OutputTooLarge` with
    Python's allocations staying near the cap (tracemalloc's peak, not RSS or time)."""
    async with McpTestServer(TOOLS, handler, name="caps", legacy=stack == "session") as server:
        conn = await McpConnection.open(
            server.url, {}, server_name="caps", max_body=CAP, fast_calls=stack == "httpx2"
        )
        conn._lean = None
        try:
            server.add_fault(Fault(gzip_text=1000))
            small = await conn.call_tool("echo", {"text": "x"}, idempotency_key=uuid.uuid4().hex, timeout=30)
            assert [b["text"] if isinstance(b, dict) else b.text for b in small.content] == ["a" * 1000]
            server.add_fault(Fault(gzip_text=100_000_000))
            tracemalloc.start()
            try:
                with pytest.raises(OutputTooLarge) as err:
                    await conn.call_tool("echo", {"text": "x"}, idempotency_key=uuid.uuid4().hex, timeout=30)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert err.value.details["limit"] == CAP
            assert peak < 8 * 1024 * 1024, peak  # httpx2 decoding it whole: ~100 MB
            again = await conn.call_tool("echo", {"text": "c"}, idempotency_key=uuid.uuid4().hex, timeout=30)
            assert again.structured_content == {"text": "c"}
        finally:
            await conn.aclose()
