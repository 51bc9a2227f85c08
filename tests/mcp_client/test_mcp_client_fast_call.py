"""How `_fast_call.post_request` reads answers a real server rarely gives on demand (hand-written HTTP).

Each case states the `MCPError` the SDK's streamable HTTP transport produces for the same answer,
so `classify` maps both paths alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx2
import orjson
import pytest
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_REQUEST
from toolbus_mcp_client._fast_call import build_call, header_map, post_request

from tests.support.mcp_answers import NOT_A_RESULT, NOT_A_RESULT_FIELDS, NOT_A_RESULT_IDS, RESULT, sse

URL = "http://mcp.test/mcp"


async def post(handler: Callable[[httpx2.Request], httpx2.Response], request_id: int = 7) -> dict[str, Any]:
    async with httpx2.AsyncClient(transport=httpx2.MockTransport(handler)) as http:
        return await post_request(http, URL, b"{}", {"content-type": "application/json"}, request_id)


def answer(status: int, body: bytes, content_type: str) -> Callable[[httpx2.Request], httpx2.Response]:
    return lambda request: httpx2.Response(status, content=body, headers={"content-type": content_type})


async def test_sse_skips_notifications_and_other_ids_and_returns_our_result() -> None:
    body = b": keep-alive\n\nevent: message\ndata:\nid: prime\n\n" + sse(
        {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 7, "progress": 1}},
        {"jsonrpc": "2.0", "id": 99, "result": {"content": []}},
        {"jsonrpc": "2.0", "id": 7, "result": RESULT},
    )
    assert await post(answer(200, body, "text/event-stream")) == RESULT


async def test_sse_error_response_is_the_servers_error() -> None:
    body = sse({"jsonrpc": "2.0", "id": "7", "error": {"code": -32602, "message": "Unknown tool: x"}})
    with pytest.raises(MCPError) as info:
        await post(answer(200, body, "text/event-stream; charset=utf-8"))
    assert (info.value.code, info.value.message) == (-32602, "Unknown tool: x")


@pytest.mark.parametrize(NOT_A_RESULT_FIELDS, NOT_A_RESULT, ids=NOT_A_RESULT_IDS)
async def test_answers_that_are_not_a_result_raise_what_the_sdk_raises(
    status: int, body: bytes, content_type: str, code: int, message: str | None
) -> None:
    with pytest.raises(MCPError) as info:
        await post(answer(status, body, content_type))
    assert info.value.code == code
    if message is not None:
        assert info.value.message == message


async def test_redirect_within_the_origin_is_followed_and_others_are_not() -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/mcp":
            return httpx2.Response(307, headers={"location": "/mcp/"})
        if request.url.path == "/mcp/":
            assert request.content == b"{}"
            return httpx2.Response(200, content=orjson.dumps({"jsonrpc": "2.0", "id": 7, "result": RESULT}),
                                   headers={"content-type": "application/json"})  # fmt: skip
        raise AssertionError(request.url)

    assert await post(handler) == RESULT
    with pytest.raises(MCPError) as info:
        await post(lambda r: httpx2.Response(307, headers={"location": "http://elsewhere.test/mcp"}))
    assert info.value.code == INVALID_REQUEST and "not followed" in info.value.message


def test_build_call_lets_the_stamp_write_the_envelope_and_mirrors_given_headers() -> None:
    def stamp(data: dict[str, Any], opts: Any) -> None:
        data["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "2026-07-28"
        opts["headers"] = {"mcp-method": data["method"], "mcp-name": data["params"]["name"]}

    schema = {"type": "object", "properties": {"n": {"type": "integer", "x-mcp-header": "N"}}}
    body, headers = build_call(stamp, 3, "t", {"n": 5}, {"k": "v"}, header_map(schema))
    assert orjson.loads(body) == {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/call",
        "params": {
            "name": "t",
            "arguments": {"n": 5},
            "_meta": {"k": "v", "io.modelcontextprotocol/protocolVersion": "2026-07-28"},
        },
    }
    assert headers == {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-method": "tools/call",
        "mcp-name": "t",
        "Mcp-Param-N": "5",
    }


def test_header_map_is_empty_for_a_schema_the_sdk_rejects() -> None:
    assert header_map({"type": "object", "properties": {"x": {"type": "number", "x-mcp-header": "X"}}}) == {}
    assert header_map(None) == {}
