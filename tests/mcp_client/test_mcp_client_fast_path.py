"""The fast `tools/call` path (2026-07-28 connections) against the SDK path, on real MCP servers.

Every test runs the same calls through `McpConnection.open(..., fast_calls=False)` (the SDK
client) and the default fast path, over both answers the SDK server gives (SSE and JSON), and
checks that results, errors and the requests on the wire are the same.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import orjson
import pytest
from toolbus_contracts.errors import ToolbusError
from toolbus_mcp_client import McpConnection, ToolResult

from tests.support.mcp_servers import Fault, McpTestServer, echo_server, paging_server

pytestmark = pytest.mark.integration

TOKEN = "tok-" + uuid.uuid4().hex

REGIONAL: dict[str, Any] = {
    "name": "regional",
    "description": "A tool whose arguments are mirrored into Mcp-Param-* headers for routing.",
    "inputSchema": {
        "type": "object",
        "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "shard": {"type": "integer", "x-mcp-header": "Shard"},
            "dry": {"type": "boolean", "x-mcp-header": "Dry-Run"},
            "text": {"type": "string"},
        },
        "required": ["region"],
    },
}


def key() -> str:
    return "idem-" + uuid.uuid4().hex


class Wire:
    """The POSTs one connection sends (its httpx2 client's request hooks also see the lean
    HTTP/1.1 path's requests): (headers without per-request ones, body)."""

    def __init__(self) -> None:
        self.sent: list[tuple[dict[str, str], dict[str, Any]]] = []

    async def __call__(self, request: httpx2.Request) -> None:
        if request.method == "POST":
            # The lean HTTP/1.1 path asks for no compression (it reads bodies as they come).
            skip = ("content-length", "accept-encoding")
            headers = {k.lower(): v for k, v in request.headers.items() if k.lower() not in skip}
            self.sent.append((headers, orjson.loads(request.content)))

    def calls(self, method: str = "tools/call") -> list[tuple[dict[str, str], dict[str, Any]]]:
        """The requests of one method, without the JSON-RPC id (each path numbers its own)."""
        return [(h, {k: v for k, v in b.items() if k != "id"}) for h, b in self.sent if b["method"] == method]


async def open_pair(url: str, headers: dict[str, str] | None = None) -> tuple[McpConnection, McpConnection]:
    fast = await McpConnection.open(url, headers or {}, server_name="srv")
    sdk = await McpConnection.open(url, headers or {}, server_name="srv", fast_calls=False)
    assert fast.protocol_version == sdk.protocol_version == "2026-07-28"
    return fast, sdk


def watch(conn: McpConnection) -> Wire:
    wire = Wire()
    conn._http.event_hooks["request"].append(wire)
    return wire


def same_error(error: Any) -> Any:
    """An error outcome without the network reason in its message: the two paths' HTTP stacks
    word it differently ("All connection attempts failed" / "ConnectionRefusedError")."""
    if isinstance(error, tuple):
        return (error[0], re.sub(r" \(.*\);", " (…);", error[1]), *error[2:])
    return error


@pytest.fixture(params=[False, True], ids=["sse", "json"])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[McpTestServer]:
    async with echo_server(name="fast-path", json_response=request.param, required_token=TOKEN) as srv:
        yield srv


@pytest.fixture
async def pair(server: McpTestServer) -> AsyncIterator[tuple[McpConnection, McpConnection]]:
    fast, sdk = await open_pair(server.url, {"Authorization": f"Bearer {TOKEN}"})
    yield fast, sdk
    await sdk.aclose()
    await fast.aclose()


async def outcome(conn: McpConnection, tool: str, args: dict[str, Any], k: str, timeout: float = 10) -> Any:
    """A call's result, or its error as (type, message, details, retryable)."""
    try:
        return await conn.call_tool(tool, args, idempotency_key=k, timeout=timeout)
    except ToolbusError as exc:
        return (type(exc).__name__, exc.message, exc.details, exc.retryable)


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("echo", {"text": "héllo ✓"}),
        ("plain", {"text": "just text"}),
        ("fail", {"text": "boom"}),
        ("nope", {}),
        ("echo", {"text": "x" * 100_000}),
    ],
    ids=["structured", "text-only", "is-error", "unknown-tool", "large"],
)
async def test_same_results_and_same_requests_on_both_paths(
    pair: tuple[McpConnection, McpConnection], tool: str, args: dict[str, Any]
) -> None:
    fast, sdk = pair
    fast_wire, sdk_wire = watch(fast), watch(sdk)
    k = key()
    got_fast = await outcome(fast, tool, args, k)
    got_sdk = await outcome(sdk, tool, args, k)
    assert got_fast == got_sdk
    if tool == "nope":
        assert got_fast[0] == "UpstreamError" and got_fast[2]["rpcCode"] == -32602
    else:
        assert isinstance(got_fast, ToolResult)
    assert fast_wire.calls() == sdk_wire.calls()
    headers, body = fast_wire.calls()[0]
    # (the Idempotency-Key header is stamped below these hooks, by the transport: see the next test)
    assert body["params"]["_meta"]["toolbus/idempotencyKey"] == k
    assert (headers["mcp-method"], headers["mcp-name"], headers["mcp-protocol-version"]) == (
        "tools/call",
        tool,
        "2026-07-28",
    )
    assert set(body["params"]["_meta"]) >= {
        "io.modelcontextprotocol/protocolVersion",
        "io.modelcontextprotocol/clientCapabilities",
    }


@pytest.mark.parametrize("json_response", [False, True], ids=["sse", "json"])
async def test_same_listing_and_same_list_requests_on_both_paths(json_response: bool) -> None:
    async with paging_server(8, 3, json_response=json_response, required_token=TOKEN) as server:
        fast, sdk = await open_pair(server.url, {"Authorization": f"Bearer {TOKEN}"})
        fast_wire, sdk_wire = watch(fast), watch(sdk)
        try:
            listed = await fast.list_tools()
            assert listed == await sdk.list_tools()
            assert [t["name"] for t in listed] == [f"op_{i:04d}" for i in range(8)]
            pages = fast_wire.calls("tools/list")
            assert pages == sdk_wire.calls("tools/list") and len(pages) == 3
            assert [b["params"].get("cursor") for _, b in pages] == [None, "3", "6"]
            assert pages[0][0]["mcp-method"] == "tools/list"
            # a rejected token is the same typed error on both paths
            server.required_token = "rotated"
            errors = []
            for conn in (fast, sdk):
                with pytest.raises(ToolbusError) as caught:
                    await conn.list_tools()
                errors.append((type(caught.value).__name__, caught.value.details))
            assert errors[0] == errors[1] == ("CredentialsRejected", {"server": "srv", "status": 401})
        finally:
            await sdk.aclose()
            await fast.aclose()


async def test_key_reaches_server_in_header_and_meta(
    pair: tuple[McpConnection, McpConnection], server: McpTestServer
) -> None:
    fast, _ = pair
    k = key()
    await fast.call_tool("echo", {"text": "a"}, idempotency_key=k, timeout=10)
    record = server.calls[-1]
    assert (record.idempotency_key_header, record.idempotency_key_meta, record.authorized) == (k, k, True)


@pytest.mark.parametrize(
    "fault",
    [Fault(drop=True), Fault(hang=True), Fault(status=503), Fault(status=500), Fault(status=401)],
    ids=["drop", "hang", "503", "500", "401"],
)
async def test_same_errors_on_both_paths(
    pair: tuple[McpConnection, McpConnection], server: McpTestServer, fault: Fault
) -> None:
    fast, sdk = pair
    got = []
    for conn in (fast, sdk):
        server.add_fault(fault)
        got.append(await outcome(conn, "echo", {"text": "x"}, key(), timeout=0.5))
    assert same_error(got[0]) == same_error(got[1])
    kind, _, details, retryable = got[0]
    expected = {
        "drop": ("UpstreamUnreachable", True, {"server": "srv", "sent": True}),
        "hang": ("Timeout", True, {"server": "srv", "sent": True, "timeout": 0.5}),
        "503": ("UpstreamError", True, {"server": "srv", "status": 503, "sent": True}),
        "500": ("UpstreamError", False, {"server": "srv", "status": 500, "sent": True}),
        "401": ("CredentialsRejected", False, {"server": "srv", "status": 401}),
    }
    name = "drop" if fault.drop else "hang" if fault.hang else str(fault.status)
    assert (kind, retryable, details) == expected[name]
    # Both connections still work after the fault.
    for conn in (fast, sdk):
        ok = await conn.call_tool("echo", {"text": "after"}, idempotency_key=key(), timeout=10)
        assert ok.structured_content == {"text": "after"}


async def test_server_gone_is_the_same_unreachable_not_sent_on_both_paths(
    pair: tuple[McpConnection, McpConnection], server: McpTestServer
) -> None:
    fast, sdk = pair
    await server.stop()
    got = [await outcome(conn, "echo", {"text": "x"}, key()) for conn in (fast, sdk)]
    assert same_error(got[0]) == same_error(got[1])
    assert got[0][0] == "UpstreamUnreachable" and got[0][2] == {"server": "srv", "sent": False}
    await server.start()
    assert (await outcome(fast, "echo", {"text": "back"}, key())).structured_content == {"text": "back"}


@pytest.mark.parametrize("json_response", [False, True], ids=["sse", "json"])
async def test_mcp_param_headers_from_a_given_schema_are_accepted_on_the_first_try(
    json_response: bool,
) -> None:
    args = {"region": "eu west ✓", "shard": 7, "dry": False, "text": "t"}
    async with McpTestServer(tools=[REGIONAL], json_response=json_response) as server:
        fast, sdk = await open_pair(server.url)
        fast_wire, sdk_wire = watch(fast), watch(sdk)
        try:
            k = key()
            result = await fast.call_tool(
                "regional", args, idempotency_key=k, timeout=10, input_schema=REGIONAL["inputSchema"]
            )
            assert result.structured_content == {"arguments": args}
            assert len(server.calls) == 1 and server.list_requests == 0
            # The SDK path learns the headers by listing after the server's HEADER_MISMATCH.
            assert await sdk.call_tool("regional", args, idempotency_key=k, timeout=10) == result
            assert len(server.calls) == 3
        finally:
            await sdk.aclose()
            await fast.aclose()
    headers = fast_wire.calls()[0][0]
    assert headers["mcp-param-region"].startswith("=?base64?")
    assert (headers["mcp-param-shard"], headers["mcp-param-dry-run"]) == ("7", "false")
    assert fast_wire.calls()[0] == sdk_wire.calls()[-1]


async def test_mcp_param_headers_from_list_tools_are_accepted_on_the_first_try() -> None:
    async with McpTestServer(tools=[REGIONAL]) as server:
        conn = await McpConnection.open(server.url, {}, server_name="routed")
        try:
            await conn.list_tools()
            result = await conn.call_tool(
                "regional", {"region": "us", "shard": 2}, idempotency_key=key(), timeout=10
            )
            assert result.structured_content == {"arguments": {"region": "us", "shard": 2}}
            assert len(server.calls) == 1
        finally:
            await conn.aclose()


async def test_mcp_param_headers_unknown_to_the_caller_are_learned_once() -> None:
    async with McpTestServer(tools=[REGIONAL]) as server:
        conn = await McpConnection.open(server.url, {}, server_name="routed")
        try:
            for region in ("eu", "us"):
                result = await conn.call_tool(
                    "regional", {"region": region}, idempotency_key=key(), timeout=10
                )
                assert result.structured_content == {"arguments": {"region": region}}
        finally:
            await conn.aclose()
        # refused (HEADER_MISMATCH), listed, resent; then the second call passes at once
        assert len(server.calls) == 3 and server.list_requests == 1
