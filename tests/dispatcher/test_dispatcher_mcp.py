"""MCP tools through the dispatcher against real MCP servers over streamable HTTP: outputs,
interruptions under `retry` and `at_most_once`, the 5-attempt budget, timeouts, and parking on 401."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from toolbus_dispatcher.credentials import StaticCredentials

from tests.dispatcher.test_dispatcher_helpers import Harness, wait_until
from tests.support.commands import publish_command
from tests.support.mcp_servers import Fault, McpTestServer, echo_tools

pytestmark = pytest.mark.integration


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def creds() -> StaticCredentials:
    return StaticCredentials()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def h(nats_url: str, redis_url: str, creds: StaticCredentials) -> AsyncIterator[Harness]:
    harness = Harness(nats_url, redis_url)
    await harness.connect()
    await harness.dispatcher(credentials=creds)
    try:
        yield harness
    finally:
        await harness.close()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def server() -> AsyncIterator[McpTestServer]:
    async with McpTestServer(name="echo") as srv:
        yield srv


async def mcp_toolset(h: Harness, url: str, name: str = "echo", **policies: dict[str, Any]) -> str:
    tools = [
        {
            k: v
            for k, v in t.items()
            if k in ("name", "title", "description", "inputSchema", "outputSchema", "annotations")
        }
        for t in echo_tools()
    ]
    return await h.toolset({"servers": [{"name": name, "url": url, "tools": tools, "policies": policies}]})


async def test_outputs_are_structured_content_else_content_and_is_error_is_tool_error(
    h: Harness, server: McpTestServer
) -> None:
    run = await h.open_run(await mcp_toolset(h, server.url))
    echo = await h.invoke(run, "echo.echo", {"text": "hi"})
    assert echo["outcome"] == {"status": "ok", "output": {"text": "hi"}}
    plain = await h.invoke(run, "echo.plain", {"text": "yo"})
    assert plain["outcome"] == {"status": "ok", "output": {"content": [{"type": "text", "text": "yo"}]}}
    fail = await h.invoke(run, "echo.fail", {"text": "x"})
    assert fail["outcome"]["error"]["code"] == "toolError"
    assert "failed on purpose" in fail["outcome"]["error"]["message"]
    record = server.calls_to("echo")[-1]
    assert record.idempotency_key_header == echo["idempotencyKey"] == record.idempotency_key_meta


async def test_a_dropped_connection_is_sent_again_with_the_same_key_under_retry(
    h: Harness, server: McpTestServer
) -> None:
    run = await h.open_run(await mcp_toolset(h, server.url))
    before = len(server.calls_to("echo"))
    server.add_fault(Fault(drop=True))
    data = await h.invoke(run, "echo.echo", {"text": "twice"}, idempotencyKey="drop-retry")
    assert data["outcome"] == {"status": "ok", "output": {"text": "twice"}}
    calls = server.calls_to("echo")[before:]
    assert [c.idempotency_key_header for c in calls] == ["drop-retry", "drop-retry"]
    assert [c.idempotency_key_meta for c in calls] == ["drop-retry", "drop-retry"]
    got = await h.ok(h.subjects.calls_get, {"callId": data["callId"]})
    assert got["attempts"] == 2


async def test_a_dropped_connection_is_outcome_unknown_under_at_most_once(
    h: Harness, server: McpTestServer
) -> None:
    ts = await mcp_toolset(h, server.url, echo={"onInterruption": "at_most_once"})
    run = await h.open_run(ts)
    before = len(server.calls_to("echo"))
    server.add_fault(Fault(drop=True))
    data = await h.invoke(run, "echo.echo", {"text": "once"})
    assert data["outcome"]["status"] == "error"
    assert data["outcome"]["error"]["code"] == "outcomeUnknown"
    assert len(server.calls_to("echo")) - before == 1
    got = await h.ok(h.subjects.calls_get, {"callId": data["callId"]})
    assert got["attempts"] == 1


async def test_a_call_that_never_gets_through_ends_after_5_attempts_with_the_last_error(
    h: Harness, server: McpTestServer
) -> None:
    run = await h.open_run(await mcp_toolset(h, server.url))
    before = len(server.calls_to("echo"))
    server.add_fault(Fault(status=503), times=5)
    data = await h.invoke(run, "echo.echo", {"text": "never"})
    assert data["outcome"]["error"]["code"] == "upstreamError"
    assert "503" in data["outcome"]["error"]["message"]
    assert len(server.calls_to("echo")) - before == 5
    got = await h.ok(h.subjects.calls_get, {"callId": data["callId"]})
    assert got["attempts"] == 5


async def test_no_answer_within_the_timeout_is_an_interruption(h: Harness, server: McpTestServer) -> None:
    ts = await mcp_toolset(h, server.url, echo={"onInterruption": "at_most_once", "timeout": "300ms"})
    run = await h.open_run(ts)
    server.add_fault(Fault(hang=True))
    data = await h.invoke(run, "echo.echo", {"text": "slow"})
    assert data["outcome"]["error"]["code"] == "outcomeUnknown"


async def test_an_unreachable_server_is_retried_then_upstream_unreachable(h: Harness) -> None:
    ts = await mcp_toolset(h, "http://127.0.0.1:9/mcp", echo={"onInterruption": "at_most_once"})
    run = await h.open_run(ts)
    data = await h.invoke(run, "echo.echo", {"text": "x"})
    # Never sent (connection refused): sent again even under at_most_once, up to 5 attempts.
    assert data["outcome"]["error"]["code"] == "upstreamUnreachable"
    got = await h.ok(h.subjects.calls_get, {"callId": data["callId"]})
    assert got["attempts"] == 5


async def _internal_messages(h: Harness, subject: str, count: int) -> list[dict[str, Any]]:
    assert h.nc is not None
    sub = await h.nc.jetstream().subscribe(subject, ordered_consumer=True)
    out: list[dict[str, Any]] = []
    try:
        while len(out) < count:
            msg = await sub.next_msg(timeout=10)
            out.append(json.loads(msg.data))
    finally:
        await sub.unsubscribe()
    return out


async def test_a_401_parks_the_call_and_a_resume_sends_it_again(h: Harness, creds: StaticCredentials) -> None:
    async with McpTestServer(name="guarded", required_token="good-token") as srv:
        ts = await mcp_toolset(h, srv.url, name="crm")
        run = await h.open_run(ts)
        creds.set("run", run, {"crm": {"Authorization": "Bearer stale-token"}})
        async with h.events(run) as seen:
            waiter = asyncio.create_task(h.invoke(run, "crm.echo", {"text": "p"}, idempotencyKey="park-1"))
            await wait_until(lambda: any(e["type"] == "parked" for e in seen), what="parked event")
            call_id = seen[0]["callId"]
            got = await h.ok(h.subjects.calls_get, {"callId": call_id})
            assert got["state"] == "parked" and got["attempts"] == 0
            parked = await _internal_messages(h, h.subjects.internal_calls_park, 1)
            assert h.nc is not None
            creds.set("run", run, {"crm": {"Authorization": "Bearer good-token"}})
            await publish_command(
                h.nc.jetstream(),
                h.subjects.internal_calls_resume,
                json.dumps({"callIds": [call_id]}).encode(),
            )
            data = await waiter
            await wait_until(lambda: seen[-1]["type"] == "completed", what="completed")
        assert data["outcome"] == {"status": "ok", "output": {"text": "p"}}
        types = [e["type"] for e in seen]
        assert types == ["accepted", "attemptStarted", "parked", "resumed", "attemptStarted", "completed"]
        assert seen[2]["server"] == "crm" and seen[2]["level"] == "run"
        assert seen[4]["attempt"] == 1
        assert parked and "Bearer" not in json.dumps(parked)
        calls = srv.calls_to("echo")
        assert {c.idempotency_key_header for c in calls} == {"park-1"}
        assert [c.authorized for c in calls][-1] is True


async def test_a_resume_with_credentials_rejected_ends_the_parked_call(
    h: Harness, creds: StaticCredentials
) -> None:
    async with McpTestServer(name="guarded2", required_token="good") as srv:
        ts = await mcp_toolset(h, srv.url, name="crm")
        run = await h.open_run(ts)
        async with h.events(run) as seen:
            waiter = asyncio.create_task(h.invoke(run, "crm.echo", {"text": "p"}))
            await wait_until(lambda: any(e["type"] == "parked" for e in seen), what="parked event")
            assert seen[2]["level"] == "toolset"
            assert h.nc is not None
            await publish_command(
                h.nc.jetstream(),
                h.subjects.internal_calls_resume,
                json.dumps({"callIds": [seen[0]["callId"]], "reason": "credentialsRejected"}).encode(),
            )
            data = await waiter
        assert data["outcome"]["error"]["code"] == "credentialsRejected"


async def test_a_403_is_credentials_rejected_not_parked(h: Harness, server: McpTestServer) -> None:
    run = await h.open_run(await mcp_toolset(h, server.url))
    server.add_fault(Fault(status=403))
    data = await h.invoke(run, "echo.echo", {"text": "no"})
    assert data["outcome"]["error"]["code"] == "credentialsRejected"
