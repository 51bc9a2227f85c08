"""Tools listed and called through the gateway with the `mcp` package's client, on both protocol
revisions toolbus speaks: pinned tools under qualified names (paged), calls as toolbus calls,
outputs as structuredContent and text, tool errors, and the run's events replayable."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from tests.gateway.conftest import Deployment, mcp_client
from tests.support.infra import js_name, request

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

MODES = ["auto", "legacy"]


async def _all_tools(client: Any) -> tuple[list[Any], int]:
    tools, pages, cursor = [], 0, None
    while True:
        result = await client.list_tools(cursor=cursor) if cursor else await client.list_tools()
        tools += result.tools
        pages += 1
        cursor = result.next_cursor
        if cursor is None:
            return tools, pages


@pytest.mark.parametrize("mode", MODES)
async def test_lists_pinned_tools_paged_under_qualified_names(
    deployment: Deployment, toolset: str, mode: str
) -> None:
    token = await deployment.token([toolset])
    async with mcp_client(deployment.url(toolset), token, mode=mode) as client:
        tools, pages = await _all_tools(client)
    names = [t.name for t in tools]
    assert len(names) == 3 + 3 + 12 and pages == 4  # 18 tools, 5 a page
    assert names == sorted(names)
    echo = next(t for t in tools if t.name == "shop.echo")
    assert echo.title == "Echo"
    assert echo.description == "Return the text it was given."
    assert echo.input_schema["required"] == ["text"]
    assert echo.output_schema is not None and echo.output_schema["properties"]["text"]["type"] == "string"
    assert echo.annotations is not None and echo.annotations.read_only_hint is True


@pytest.mark.parametrize("mode", MODES)
async def test_call_gives_structured_output_and_text(deployment: Deployment, toolset: str, mode: str) -> None:
    token = await deployment.token([toolset])
    async with mcp_client(deployment.url(toolset), token, mode=mode) as client:
        result = await client.call_tool("shop.echo", {"text": f"hi {mode}"})
        plain = await client.call_tool("shop.plain", {"text": "just text"})
        failed = await client.call_tool("shop.fail", {"text": "x"})
    assert result.is_error is False
    assert result.structured_content == {"text": f"hi {mode}"}
    assert json.loads(result.content[0].text) == {"text": f"hi {mode}"}  # type: ignore[union-attr]
    assert result.meta is not None and result.meta["toolbus/runId"].startswith("run_")
    assert plain.content[0].text == "just text"  # type: ignore[union-attr]
    assert failed.is_error is True
    assert failed.content[0].text.startswith("toolError")  # type: ignore[union-attr]
    assert failed.meta is not None and failed.meta["toolbus/error"]["code"] == "toolError"


async def test_a_session_is_one_run_and_its_events_replay(deployment: Deployment, toolset: str) -> None:
    token = await deployment.token([toolset])
    async with mcp_client(deployment.url(toolset), token, mode="legacy") as client:
        first = await client.call_tool("shop.echo", {"text": "one"})
        second = await client.call_tool("shop.echo", {"text": "two"})
    assert first.meta is not None and second.meta is not None
    run_id = first.meta["toolbus/runId"]
    assert second.meta["toolbus/runId"] == run_id
    calls = {first.meta["toolbus/callId"], second.meta["toolbus/callId"]}
    js = deployment.nc.jetstream()
    completed: set[str] = set()
    for _ in range(100):
        sub = await js.subscribe(
            deployment.subjects.run_events(run_id),
            stream=js_name(deployment.prefix, "EVENTS"),
            ordered_consumer=True,
        )
        events = []
        try:
            while True:
                msg = await sub.next_msg(timeout=5)
                events.append(json.loads(msg.data))
                if msg.metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
        completed = {e["callId"] for e in events if e["type"] == "completed"}
        if completed == calls:
            break
        import asyncio

        await asyncio.sleep(0.05)
    assert completed == calls


async def test_a_named_run_is_joined(deployment: Deployment, toolset: str) -> None:
    token = await deployment.token([toolset])
    run_id = "run_named_by_client_1"
    async with mcp_client(deployment.url(toolset), token, headers={"Mcp-Run": run_id}) as client:
        result = await client.call_tool("shop.echo", {"text": "in my run"})
    assert result.meta is not None and result.meta["toolbus/runId"] == run_id
    status = await deployment.ok(deployment.subjects.calls_get, {"callId": result.meta["toolbus/callId"]})
    assert status["state"] == "done"


async def test_unknown_tool_is_a_jsonrpc_error_and_bad_input_a_tool_error(
    deployment: Deployment, toolset: str
) -> None:
    token = await deployment.token([toolset])
    async with mcp_client(deployment.url(toolset), token) as client:
        with pytest.raises(MCPError) as raised:
            await client.call_tool("shop.nope", {"text": "x"})
        bad = await client.call_tool("shop.echo", {"text": 42})
    assert raised.value.error.code == -32602
    assert "not in this toolset" in raised.value.error.message
    assert bad.is_error is True
    assert bad.meta is not None and bad.meta["toolbus/error"]["code"] == "invalidInput"


async def test_an_idle_run_is_closed_and_the_next_call_opens_another(
    deployment: Deployment, toolset: str
) -> None:
    token = await deployment.token([toolset], namespace="idle-user")
    runs = deployment.gateway.runs
    assert runs is not None
    async with mcp_client(deployment.url(toolset), token) as client:
        first = await client.call_tool("shop.echo", {"text": "before"})
        assert first.meta is not None
        assert await runs.close_idle(now=time.monotonic() + 10_000) >= 1
        reopened = await request(
            deployment.nc,
            deployment.subjects.runs_open,
            {"toolsetId": toolset, "namespace": "idle-user", "runId": first.meta["toolbus/runId"]},
        )
        assert reopened["ok"] is False and reopened["error"]["code"] == "conflict"  # a closed run's id
        second = await client.call_tool("shop.echo", {"text": "after"})
    assert second.meta is not None and second.structured_content == {"text": "after"}
    assert second.meta["toolbus/runId"] != first.meta["toolbus/runId"]
