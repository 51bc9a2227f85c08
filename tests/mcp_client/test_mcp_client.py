"""`McpConnection` and `McpPool` against real MCP servers over streamable HTTP (tests.support)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from toolbus_contracts.errors import (
    CredentialsRejected,
    Timeout,
    ToolbusError,
    UpstreamError,
    UpstreamUnreachable,
)
from toolbus_mcp_client import IDEMPOTENCY_META_KEY, McpConnection, McpPool, ToolResult

from tests.support.infra import free_port, until
from tests.support.mcp_servers import (
    Fault,
    McpTestServer,
    echo_server,
    paging_server,
    synthetic_tools,
    token_server,
)

pytestmark = pytest.mark.integration

TOKEN = "tok-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
async def shared_echo() -> AsyncIterator[McpTestServer]:
    async with echo_server(name="shared-echo") as server:
        yield server


@pytest.fixture
async def server() -> AsyncIterator[McpTestServer]:
    """A fresh echo server per test, for tests that inject faults or count calls."""
    async with echo_server(name="fresh-echo") as fresh:
        yield fresh


@pytest.fixture
async def conn(server: McpTestServer) -> AsyncIterator[McpConnection]:
    connection = await McpConnection.open(server.url, {}, server_name="echo")
    yield connection
    await connection.aclose()


def key() -> str:
    return "idem-" + uuid.uuid4().hex


def assert_no_secret(error: ToolbusError, secret: str) -> None:
    assert error.details["server"]
    assert secret not in error.message
    assert secret not in repr(error.details)
    assert secret not in str(error.to_wire())


async def test_list_tools_gives_wire_form_and_omits_absent_keys(shared_echo: McpTestServer) -> None:
    conn = await McpConnection.open(shared_echo.url, {}, server_name="echo")
    try:
        tools = await conn.list_tools()
    finally:
        await conn.aclose()
    by_name = {t["name"]: t for t in tools}
    assert list(by_name) == ["echo", "plain", "fail"]
    assert by_name["echo"] == shared_echo.tools[0]
    assert set(by_name["plain"]) == {"name", "description", "inputSchema"}


async def test_list_tools_follows_next_cursor_to_the_end() -> None:
    async with paging_server(n=8, page_size=3) as server:
        conn = await McpConnection.open(server.url, {}, server_name="paged")
        try:
            tools = await conn.list_tools()
        finally:
            await conn.aclose()
        assert [t["name"] for t in tools] == [t["name"] for t in synthetic_tools(8)]
        assert server.list_requests == 3


async def test_call_returns_structured_content_and_content_blocks(conn: McpConnection) -> None:
    result = await conn.call_tool("echo", {"text": "hello"}, idempotency_key=key(), timeout=10)
    assert result == ToolResult(
        is_error=False,
        structured_content={"text": "hello"},
        content=[{"type": "text", "text": '{"text": "hello"}'}],
    )


async def test_call_without_structured_content(conn: McpConnection) -> None:
    result = await conn.call_tool("plain", {"text": "just text"}, idempotency_key=key(), timeout=10)
    assert result.structured_content is None
    assert result.content == [{"type": "text", "text": "just text"}]
    assert result.is_error is False


async def test_is_error_result_is_a_result_not_an_exception(conn: McpConnection) -> None:
    result = await conn.call_tool("fail", {"text": "boom"}, idempotency_key=key(), timeout=10)
    assert result.is_error is True
    assert result.content == [{"type": "text", "text": "failed on purpose: boom"}]


async def test_idempotency_key_reaches_server_in_header_and_meta(
    conn: McpConnection, server: McpTestServer
) -> None:
    first, second = key(), key()
    await conn.call_tool("echo", {"text": "a"}, idempotency_key=first, timeout=10)
    await conn.call_tool("echo", {"text": "b"}, idempotency_key=second, timeout=10)
    seen = [(c.arguments["text"], c.idempotency_key_header, c.idempotency_key_meta) for c in server.calls]
    assert seen == [("a", first, first), ("b", second, second)]
    assert IDEMPOTENCY_META_KEY == "toolbus/idempotencyKey"


async def test_concurrent_calls_share_one_connection_and_keep_their_own_keys(
    conn: McpConnection, server: McpTestServer
) -> None:
    server.call_delay = 0.02
    keys = [key() for _ in range(40)]
    results = await asyncio.gather(
        *(conn.call_tool("echo", {"text": k}, idempotency_key=k, timeout=10) for k in keys)
    )
    assert [r.structured_content for r in results] == [{"text": k} for k in keys]
    assert sorted((c.arguments["text"], c.idempotency_key_header) for c in server.calls) == sorted(
        (k, k) for k in keys
    )
    assert all(c.idempotency_key_meta == c.idempotency_key_header for c in server.calls)


async def test_json_rpc_error_from_server_is_a_final_upstream_error(conn: McpConnection) -> None:
    with pytest.raises(UpstreamError) as info:
        await conn.call_tool("nope", {}, idempotency_key=key(), timeout=10)
    assert info.value.retryable is False
    assert info.value.details["rpcCode"] == -32602
    assert info.value.details["server"] == "echo"
    assert "Unknown tool: nope" in info.value.message


async def test_401_is_credentials_rejected_naming_the_server_without_the_token() -> None:
    async with token_server(TOKEN) as server:
        with pytest.raises(CredentialsRejected) as info:
            await McpConnection.open(server.url, {"Authorization": "Bearer wrong-" + TOKEN}, server_name="gh")
        assert info.value.details == {"server": "gh", "status": 401}
        assert "'gh'" in info.value.message
        assert_no_secret(info.value, TOKEN)


async def test_token_rotation_mid_life_gives_credentials_rejected_on_call() -> None:
    async with token_server(TOKEN) as server:
        conn = await McpConnection.open(server.url, {"Authorization": f"Bearer {TOKEN}"}, server_name="gh")
        try:
            ok = await conn.call_tool("echo", {"text": "x"}, idempotency_key=key(), timeout=10)
            assert ok.structured_content == {"text": "x"}
            server.required_token = "rotated-" + TOKEN
            with pytest.raises(CredentialsRejected) as info:
                await conn.call_tool("echo", {"text": "y"}, idempotency_key=key(), timeout=10)
            assert info.value.details == {"server": "gh", "status": 401}
            assert info.value.retryable is False
            assert_no_secret(info.value, TOKEN)
        finally:
            await conn.aclose()


async def test_a_latin1_credential_goes_as_its_latin1_bytes_on_listing_and_calls() -> None:
    """The credential rules take Latin-1 text (`é`, a no-break space); given to httpx2 as text,
    such a value made every request raise (`internal` at registration and on every call)."""
    token = "tökén\u00a0é-" + TOKEN  # the test server reads header bytes as Latin-1
    async with token_server(token) as server:
        conn = await McpConnection.open(server.url, {"Authorization": f"Bearer {token}"}, server_name="gh")
        try:
            assert [t["name"] for t in await conn.list_tools()]
            ok = await conn.call_tool("echo", {"text": "x"}, idempotency_key=key(), timeout=10)
            assert ok.structured_content == {"text": "x"}
        finally:
            await conn.aclose()


async def test_refused_port_is_unreachable_and_not_sent() -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    with pytest.raises(UpstreamUnreachable) as info:
        await McpConnection.open(url, {"Authorization": f"Bearer {TOKEN}"}, server_name="down")
    assert info.value.retryable is True
    assert info.value.details == {"server": "down", "sent": False}
    assert "'down'" in info.value.message
    assert_no_secret(info.value, TOKEN)


async def test_unknown_host_is_unreachable_and_not_sent() -> None:
    with pytest.raises(UpstreamUnreachable) as info:
        await McpConnection.open("http://no-such-host.invalid/mcp", {}, server_name="nx", timeout=10)
    assert info.value.details == {"server": "nx", "sent": False}


async def test_server_gone_after_open_is_unreachable_not_sent_then_recovers() -> None:
    server = echo_server(name="comes-back")
    await server.start()
    conn = await McpConnection.open(server.url, {}, server_name="flaky")
    try:
        await server.stop()
        with pytest.raises(UpstreamUnreachable) as info:
            await conn.call_tool("echo", {"text": "x"}, idempotency_key=key(), timeout=10)
        assert info.value.details == {"server": "flaky", "sent": False}
        assert server.calls == []
    finally:
        await conn.aclose()


async def test_dropped_connection_is_retryable_and_marked_sent(
    conn: McpConnection, server: McpTestServer
) -> None:
    server.add_fault(Fault(drop=True))
    k = key()
    with pytest.raises(UpstreamUnreachable) as info:
        await conn.call_tool("echo", {"text": "lost"}, idempotency_key=k, timeout=10)
    assert info.value.retryable is True
    assert info.value.details == {"server": "echo", "sent": True}
    again = await conn.call_tool("echo", {"text": "lost"}, idempotency_key=k, timeout=10)
    assert again.structured_content == {"text": "lost"}
    assert [c.idempotency_key_header for c in server.calls] == [k, k]


async def test_no_answer_within_timeout_is_timeout(conn: McpConnection, server: McpTestServer) -> None:
    server.add_fault(Fault(hang=True))
    with pytest.raises(Timeout) as info:
        await conn.call_tool("echo", {"text": "slow"}, idempotency_key=key(), timeout=0.3)
    assert info.value.retryable is True
    assert info.value.details["server"] == "echo"
    assert info.value.details["sent"] is True
    after = await conn.call_tool("echo", {"text": "next"}, idempotency_key=key(), timeout=10)
    assert after.structured_content == {"text": "next"}


@pytest.mark.parametrize("status", [502, 503, 504])
async def test_gateway_statuses_are_retryable_upstream_errors(
    conn: McpConnection, server: McpTestServer, status: int
) -> None:
    server.add_fault(Fault(status=status))
    with pytest.raises(UpstreamError) as info:
        await conn.call_tool("echo", {"text": "x"}, idempotency_key=key(), timeout=10)
    assert info.value.retryable is True
    assert info.value.details == {"server": "echo", "status": status, "sent": True}


@pytest.mark.parametrize("status", [400, 500])
async def test_other_statuses_are_final_upstream_errors(
    conn: McpConnection, server: McpTestServer, status: int
) -> None:
    server.add_fault(Fault(status=status))
    with pytest.raises(UpstreamError) as info:
        await conn.call_tool("echo", {"text": "x"}, idempotency_key=key(), timeout=10)
    assert info.value.retryable is False
    assert info.value.details["status"] == status


async def test_403_on_call_is_credentials_rejected(conn: McpConnection, server: McpTestServer) -> None:
    server.add_fault(Fault(status=403))
    with pytest.raises(CredentialsRejected) as info:
        await conn.call_tool("echo", {"text": "x"}, idempotency_key=key(), timeout=10)
    assert info.value.details == {"server": "echo", "status": 403}


async def test_legacy_2025_session_mode_works_and_survives_a_server_restart() -> None:
    async with echo_server(name="legacy") as server:
        conn = await McpConnection.open(server.url, {}, server_name="legacy", mode="legacy")
        try:
            assert conn.protocol_version == "2025-11-25"
            assert [t["name"] for t in await conn.list_tools()] == ["echo", "plain", "fail"]
            k = key()
            result = await conn.call_tool("echo", {"text": "old"}, idempotency_key=k, timeout=10)
            assert result.structured_content == {"text": "old"}
            assert (server.calls[-1].idempotency_key_header, server.calls[-1].idempotency_key_meta) == (k, k)
            # A restarted server no longer knows the session (404): the connection opens a new one.
            await server.stop()
            await server.start()
            again = await conn.call_tool("echo", {"text": "new"}, idempotency_key=k, timeout=10)
            assert again.structured_content == {"text": "new"}
            # The test server records every tools/call that arrives, the one refused for its session too.
            assert [c.arguments["text"] for c in server.calls] == ["old", "new", "new"]
        finally:
            await conn.aclose()


async def test_tool_with_mcp_param_headers_is_listed_then_called_once() -> None:
    tool = {
        "name": "regional",
        "description": "A tool whose region argument is mirrored into a header for routing.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "region": {"type": "string", "x-mcp-header": "Region"},
                "text": {"type": "string"},
            },
            "required": ["region"],
        },
    }
    async with McpTestServer(tools=[tool]) as server:
        conn = await McpConnection.open(server.url, {}, server_name="routed")
        try:
            k = key()
            result = await conn.call_tool(
                "regional", {"region": "eu", "text": "t"}, idempotency_key=k, timeout=10
            )
            assert result.structured_content == {"arguments": {"region": "eu", "text": "t"}}
            again = await conn.call_tool("regional", {"region": "us"}, idempotency_key=key(), timeout=10)
            assert again.structured_content == {"arguments": {"region": "us"}}
        finally:
            await conn.aclose()
        assert [c.idempotency_key_header for c in server.calls[:2]] == [k, k]
        assert len(server.calls) == 3


async def test_connection_reconnects_after_a_restart_on_2026(server: McpTestServer) -> None:
    conn = await McpConnection.open(server.url, {}, server_name="echo")
    try:
        await server.stop()
        await server.start()
        result = await conn.call_tool("echo", {"text": "back"}, idempotency_key=key(), timeout=10)
        assert result.structured_content == {"text": "back"}
    finally:
        await conn.aclose()


async def test_pool_reuses_one_connection_per_url_and_headers(shared_echo: McpTestServer) -> None:
    pool = McpPool()
    try:
        a = await pool.get(shared_echo.url, {"Authorization": "Bearer a"}, server_name="echo")
        again = await pool.get(shared_echo.url, {"Authorization": "Bearer a"}, server_name="echo")
        other = await pool.get(shared_echo.url, {"Authorization": "Bearer b"}, server_name="echo")
        assert a is again
        assert other is not a
        assert len(pool) == 2
    finally:
        await pool.aclose()
    assert a.closed and other.closed


async def test_pool_concurrent_first_callers_share_one_opening(shared_echo: McpTestServer) -> None:
    pool = McpPool()
    try:
        conns = await asyncio.gather(*(pool.get(shared_echo.url, {}, server_name="echo") for _ in range(20)))
        assert len({id(c) for c in conns}) == 1
    finally:
        await pool.aclose()


async def test_pool_evicts_least_recently_used_and_closes_it(shared_echo: McpTestServer) -> None:
    pool = McpPool(max_size=2, evict_grace=0.0)
    try:
        a = await pool.get(shared_echo.url, {"X-K": "a"}, server_name="echo")
        b = await pool.get(shared_echo.url, {"X-K": "b"}, server_name="echo")
        assert await pool.get(shared_echo.url, {"X-K": "a"}, server_name="echo") is a
        c = await pool.get(shared_echo.url, {"X-K": "c"}, server_name="echo")
        assert len(pool) == 2
        # The evicted connection closes in the background: wait for it (a 1 s loop was a timing bound).
        await until(lambda: b.closed, "the evicted connection closed", 30)
        assert not a.closed and not c.closed
        result = await a.call_tool("echo", {"text": "still"}, idempotency_key=key(), timeout=10)
        assert result.structured_content == {"text": "still"}
    finally:
        await pool.aclose()


async def test_pool_eviction_lets_calls_in_flight_finish(server: McpTestServer) -> None:
    pool = McpPool(max_size=1, evict_grace=30.0)
    try:
        a = await pool.get(server.url, {"X-K": "a"}, server_name="echo")
        server.add_fault(Fault(delay=0.3))
        call = asyncio.create_task(a.call_tool("echo", {"text": "slow"}, idempotency_key=key(), timeout=10))
        await server.wait_for_calls(1)
        b = await pool.get(server.url, {"X-K": "b"}, server_name="echo")
        assert b is not a
        assert (await call).structured_content == {"text": "slow"}
    finally:
        await pool.aclose()
    assert a.closed


async def test_closed_connection_refuses_calls(server: McpTestServer) -> None:
    conn = await McpConnection.open(server.url, {}, server_name="echo")
    await conn.aclose()
    with pytest.raises(UpstreamUnreachable) as info:
        await conn.call_tool("echo", {"text": "x"}, idempotency_key=key(), timeout=10)
    assert info.value.details == {"server": "echo", "sent": False}
    assert server.calls == []


async def test_pool_does_not_remember_a_failed_opening() -> None:
    pool = McpPool()
    url = f"http://127.0.0.1:{free_port()}/mcp"
    try:
        with pytest.raises(UpstreamUnreachable):
            await pool.get(url, {}, server_name="down")
        assert len(pool) == 0
    finally:
        await pool.aclose()
