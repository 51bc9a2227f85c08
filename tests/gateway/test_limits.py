"""Bodies at the edges of what the gateway takes: over the bytes a NATS message may carry, nested
deeper than JSON encoders go, over the body limit (with and without Content-Length), and an
unsupported protocol version: each answered with a tool error or a JSON-RPC error that says what
is wrong, never an internal error."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
import pytest_asyncio
from mcp.shared.exceptions import MCPError
from toolbus_gateway.app import GatewayApp

from tests.gateway.conftest import Deployment, mcp_client
from tests.gateway.test_access import HEADERS, LIST

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def roomy(deployment: Deployment) -> AsyncIterator[GatewayApp]:
    """A second gateway on the same services taking bodies up to 8 MiB (over NATS's 1 MiB)."""
    settings = deployment.gateway.gateway_settings.model_copy(update={"max_body_bytes": 8 * 1024 * 1024})
    app = GatewayApp(deployment.gateway.settings, settings)
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


async def test_an_input_over_the_nats_max_payload_is_an_invalid_request_tool_error(
    deployment: Deployment, toolset: str, roomy: GatewayApp
) -> None:
    token = await deployment.token([toolset])
    async with mcp_client(f"{roomy.url}/mcp/{toolset}", token) as client:
        result = await client.call_tool("shop.echo", {"text": "x" * 3_000_000})
    assert result.is_error is True
    assert result.meta is not None and result.meta["toolbus/error"]["code"] == "invalidRequest"
    assert "bytes a NATS message may carry" in result.meta["toolbus/error"]["message"]


def _call_body(depth: int) -> bytes:
    """A `tools/call` of `shop.echo` whose arguments carry a value nested `depth` objects deep."""
    deep = '{"a":' * depth + '"x"' + "}" * depth
    meta = LIST["params"]["_meta"]
    head = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    envelope = orjson.dumps({"name": "shop.echo", "_meta": meta}).decode()[:-1]
    return (
        orjson.dumps(head).decode()[:-1]
        + f',"params":{envelope},"arguments":{{"text":"x","deep":{deep}}}}}}}'
    ).encode()


@pytest.mark.parametrize("depth", [200, 300, 900, 1500])
async def test_deeply_nested_arguments_say_what_is_wrong(
    deployment: Deployment, toolset: str, roomy: GatewayApp, depth: int
) -> None:
    token = await deployment.token([toolset])
    headers = {**HEADERS, "Authorization": f"Bearer {token}", "Mcp-Protocol-Version": "2026-07-28"}
    headers |= {"Mcp-Method": "tools/call", "Mcp-Name": "shop.echo"}
    async with httpx.AsyncClient(timeout=30) as http:
        reply = await http.post(f"{roomy.url}/mcp/{toolset}", content=_call_body(depth), headers=headers)
    assert "Traceback" not in reply.text and 'File "' not in reply.text
    body = reply.json()
    if "error" in body:
        assert body["error"]["code"] != -32603, body
        return
    result = body["result"]
    assert result["isError"] is True, depth
    assert result["_meta"]["toolbus/error"]["code"] in ("invalidRequest", "invalidInput"), result


async def _chunked(url: str, token: str, body: bytes, size: int) -> httpx.Response:
    headers = {**HEADERS, "Authorization": f"Bearer {token}", "Mcp-Protocol-Version": "2026-07-28"}
    headers["Mcp-Method"] = "tools/list"

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: Transfer-Encoding chunked
        for start in range(0, len(body), size):
            yield body[start : start + size]

    async with httpx.AsyncClient(timeout=10) as http:
        return await http.post(url, content=chunks(), headers=headers)


async def test_a_chunked_body_over_the_limit_is_a_jsonrpc_413(deployment: Deployment, toolset: str) -> None:
    token = await deployment.token([toolset])
    big = orjson.dumps({**LIST, "params": {**LIST["params"], "pad": "x" * (80 * 1024)}})
    reply = await _chunked(deployment.url(toolset), token, big, 1024)
    assert reply.status_code == 413
    assert reply.json()["error"]["code"] < 0
    assert "bytes" in reply.json()["error"]["message"]
    small = await _chunked(deployment.url(toolset), token, orjson.dumps(LIST), 16)
    assert small.status_code == 200, small.text
    assert small.json()["result"]["tools"]


async def test_an_unsupported_protocol_version_is_named_with_the_supported_ones(
    deployment: Deployment, toolset: str
) -> None:
    token = await deployment.token([toolset])
    headers = {**HEADERS, "Authorization": f"Bearer {token}", "Mcp-Protocol-Version": "1999-01-01"}
    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.post(deployment.url(toolset), json={**LIST, "params": {}}, headers=headers)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["code"] == -32022
    assert "Unsupported protocol version 1999-01-01" in error["message"]
    assert "2026-07-28" in error["message"] and "2025-11-25" in error["message"]
    assert "_meta must be" not in error["message"]
    assert error["data"]["supported"][:2] == ["2026-07-28", "2025-11-25"]


async def test_a_bug_in_a_call_is_an_internal_error_without_a_stack_trace(
    deployment: Deployment,
    toolset: str,
    roomy: GatewayApp,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fault injected where no failure is expected: -32603 that names no internals, and a log
    line with the exception's type and place but no trace."""

    async def broken(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise RuntimeError("detail of the bug")

    assert roomy.gateway is not None
    monkeypatch.setattr(roomy.gateway._calls, "invoke", broken)
    token = await deployment.token([toolset])
    with caplog.at_level(logging.ERROR):
        async with mcp_client(f"{roomy.url}/mcp/{toolset}", token) as client:
            with pytest.raises(MCPError) as raised:
                await client.call_tool("shop.echo", {"text": "x"})
    assert raised.value.error.code == -32603
    assert "detail of the bug" not in raised.value.error.message
    records = [r for r in caplog.records if r.getMessage() == "tools/call failed"]
    assert records and getattr(records[0], "error", None) == "RuntimeError"
    assert all(r.exc_info is None for r in caplog.records), [
        r.getMessage() for r in caplog.records if r.exc_info
    ]
