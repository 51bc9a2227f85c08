"""Outputs stored by reference are fetched transparently (and checked); the `search_tools` and
`call_tool` definitions and handlers in the Anthropic, OpenAI and MCP shapes, against the real
registry and dispatcher."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import orjson
import pytest
from toolbus import Internal, Toolbus, Unavailable
from toolbus._outcomes import resolve
from toolbus.agent import CALL_TOOL, SEARCH_TOOLS, AgentTools

from tests.support.mcp_servers import McpTestServer

pytestmark = pytest.mark.e2e


async def test_an_output_ref_is_read_from_the_object_store_and_checked(tb: Toolbus) -> None:
    # The documented v1.1 form, with an object put here: 3 MiB, well over one NATS message.
    output = {"rows": ["r" * 1000] * 3000}
    data = orjson.dumps(output)
    bucket = tb.stream("outputs")
    try:  # the dispatcher creates it (issue 11); create it where it has not
        store = await tb.js.object_store(bucket)
    except Exception:
        store = await tb.js.create_object_store(bucket)
    await store.put("call-big-sdk-test", data)
    ref = {
        "bucket": bucket,
        "name": "call-big-sdk-test",
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    result = await resolve(tb.js, {"status": "ok", "outputRef": ref}, call_id="call-big", idempotency_key="k")
    assert result.ok and result.output == output

    with pytest.raises(Internal):
        await resolve(
            tb.js,
            {"status": "ok", "outputRef": {**ref, "sha256": "0" * 64}},
            call_id="x",
            idempotency_key=None,
        )
    with pytest.raises(Unavailable):
        await resolve(
            tb.js,
            {"status": "ok", "outputRef": {**ref, "name": "missing"}},
            call_id="y",
            idempotency_key=None,
        )


async def test_a_large_output_through_a_real_call(tb: Toolbus, mcp_server: McpTestServer) -> None:
    # Whatever form the dispatcher uses for it (inline today if it fits, outputRef where issue 11
    # stores it), the caller gets the whole output.
    toolset = await tb.toolsets.create(mcp=[{"name": "everything", "url": mcp_server.url}])
    async with await tb.runs.open(toolset) as run:
        result = await run.invoke("everything.big", {"n": 2_000_000})  # 2 MB: over one NATS message
        status = await tb.runs.call_status(result.call_id)
    assert result.output == {"text": "x" * 2_000_000}
    assert status.result is not None and status.result.output == result.output


def test_definitions_in_each_api_shape() -> None:
    anthropic = SEARCH_TOOLS.anthropic()
    assert anthropic["name"] == "search_tools" and anthropic["input_schema"]["required"] == ["query"]
    openai = CALL_TOOL.openai()
    assert openai["type"] == "function" and openai["function"]["name"] == "call_tool"
    assert openai["function"]["parameters"]["required"] == ["name"]
    mcp = SEARCH_TOOLS.mcp()
    assert set(mcp) == {"name", "description", "inputSchema"}
    import jsonschema

    for definition in (SEARCH_TOOLS, CALL_TOOL):
        jsonschema.Draft202012Validator.check_schema(definition.input_schema)


async def test_search_tools_and_call_tool_handlers_in_each_format(
    tb: Toolbus, mcp_server: McpTestServer
) -> None:
    toolset = await tb.toolsets.create(mcp=[{"name": "everything", "url": mcp_server.url}])
    async with await tb.runs.open(toolset) as run:
        agent = AgentTools(run)
        assert [t["name"] for t in agent.anthropic()] == ["search_tools", "call_tool"]
        assert [t["function"]["name"] for t in agent.openai()] == ["search_tools", "call_tool"]
        assert [t["name"] for t in agent.mcp()] == ["search_tools", "call_tool"]

        # Anthropic: a tool_use block in, a tool_result block out.
        block = await agent.answer_anthropic(
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "search_tools",
                "input": {"query": "report a tool error", "limit": 2},
            }
        )
        assert (
            block["type"] == "tool_result" and block["tool_use_id"] == "toolu_1" and "is_error" not in block
        )
        found = json.loads(block["content"])
        assert found["ok"] and found["tools"][0]["name"] == "everything.fail"
        assert "fail" in found["tools"][0]["declaration"]

        # OpenAI: a tool_calls[] item (arguments as a JSON string) in, a role=tool message out.
        message = await agent.answer_openai(
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "search_tools", "arguments": json.dumps({"query": "echo text back"})},
            }
        )
        assert message["role"] == "tool" and message["tool_call_id"] == "call_1"
        assert json.loads(message["content"])["ok"] is True
        called = await agent.answer_openai(
            {
                "id": "call_2",
                "type": "function",
                "function": {
                    "name": "call_tool",
                    "arguments": json.dumps({"name": "everything.echo", "input": {"text": "via openai"}}),
                },
            }
        )
        assert json.loads(called["content"]) == {"ok": True, "output": {"text": "via openai"}}
        bad = await agent.answer_openai(
            {"id": "c3", "function": {"name": "call_tool", "arguments": "{not json"}}
        )
        assert json.loads(bad["content"])["error"]["code"] == "invalidInput"

        # MCP: tools/call params in, a CallToolResult out.
        result: dict[str, Any] = await agent.answer_mcp(
            {"name": "search_tools", "arguments": {"query": "echo"}}
        )
        assert result["isError"] is False and result["structuredContent"]["ok"] is True
        failed = await agent.answer_mcp(
            {"name": "call_tool", "arguments": {"name": "everything.fail", "input": {"text": "x"}}}
        )
        assert failed["isError"] is True and failed["structuredContent"]["error"]["code"] == "toolError"
        unknown = await agent.answer_anthropic(
            {"id": "t2", "name": "call_tool", "input": {"name": "nope.tool"}}
        )
        assert (
            unknown["is_error"] is True and json.loads(unknown["content"])["error"]["code"] == "unknownTool"
        )
