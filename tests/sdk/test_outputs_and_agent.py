"""Outputs stored by reference are fetched transparently (and checked); the `search_tools` and
`call_tool` definitions and handlers in the Anthropic, OpenAI and MCP shapes, against the real
registry and dispatcher."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import orjson
import pytest
from anthropic.types import ToolResultBlockParam
from anthropic.types.beta import BetaToolReferenceBlockParam
from openai.types.responses import ResponseToolSearchOutputItemParamParam
from openai.types.responses.response_input_item_param import FunctionCallOutput
from toolbus import Internal, Toolbus, Unavailable
from toolbus._outcomes import resolve
from toolbus.agent import CALL_TOOL, LIST_TOOLS, SEARCH_TOOLS, AgentTools, DeferredTools

from tests.sdk.test_agent_tools import conforms
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

    for definition in (SEARCH_TOOLS, LIST_TOOLS, CALL_TOOL):
        jsonschema.Draft202012Validator.check_schema(definition.input_schema)


async def test_search_tools_and_call_tool_handlers_in_each_format(
    tb: Toolbus, mcp_server: McpTestServer
) -> None:
    toolset = await tb.toolsets.create(mcp=[{"name": "everything", "url": mcp_server.url}])
    async with await tb.runs.open(toolset) as run:
        agent = AgentTools(run)
        names = ["search_tools", "list_tools", "call_tool"]
        assert [t["name"] for t in agent.anthropic()] == names
        assert [t["function"]["name"] for t in agent.openai()] == names
        assert [t["name"] for t in agent.mcp()] == names

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


MAIL_TOOLS = {
    "send_message": "Send an email message to a recipient.",
    "list_messages": "List the messages of a mailbox.",
    "delete_message": "Delete one email message.",
}


async def test_a_scripted_agent_loop_reads_the_catalogue_scopes_a_search_browses_and_calls(
    tb: Toolbus, mcp_server: McpTestServer
) -> None:
    """The loop a model drives: the catalogue in search_tools' description, a search scoped to
    the namespace it names, a namespace listed, a tool called; printed as a transcript (-s)."""
    tools = [
        {
            "name": n,
            "description": d,
            "inputSchema": {"type": "object", "properties": {"to": {"type": "string"}}},
        }
        for n, d in MAIL_TOOLS.items()
    ]
    async with McpTestServer(tools, name="mail", instructions="Company email: send and read mail.") as mail:
        toolset = await tb.toolsets.create(
            mcp=[
                {
                    "name": "everything",
                    "url": mcp_server.url,
                    "description": "Test tools that echo and fail.",
                },
                {"name": "mail", "url": mail.url},
            ]
        )
        async with await tb.runs.open(toolset) as run:
            agent = await AgentTools.open(run)
            transcript: list[str] = []
            search = agent.anthropic()[0]
            catalogue = search["description"].split("\n\n", 1)[1]
            transcript.append(f"[search_tools description, catalogue part]\n{catalogue}")
            assert catalogue.splitlines() == [
                "Namespaces:",
                "- everything (mcp, 4 tools): Test tools that echo and fail.",
                "- mail (mcp, 3 tools): Company email: send and read mail.",
            ]
            steps: list[tuple[str, dict[str, Any]]] = [
                ("search_tools", {"query": "send message", "namespaces": ["mail"], "limit": 3}),
                ("list_tools", {"namespace": "everything"}),
                ("call_tool", {"name": "everything.echo", "input": {"text": "hello"}}),
            ]
            results = []
            for i, (name, arguments) in enumerate(steps):
                block = await agent.answer_anthropic(
                    {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": arguments}
                )
                result = json.loads(block["content"])
                results.append(result)
                transcript.append(
                    f"[tool_use {name}] {json.dumps(arguments)}\n[tool_result] {json.dumps(result)[:600]}"
                )
            print("\n\n".join(transcript))
            found, listed, called = results
            assert found["ok"] and found["tools"][0]["name"] == "mail.send_message"
            assert {t["namespace"] for t in found["tools"]} == {"mail"}
            assert listed["ok"] and listed["pages"] == 1
            assert [line.split("(")[0] for line in listed["tools"]] == [
                "everything.big",
                "everything.echo",
                "everything.fail",
                "everything.plain",
            ]
            assert called == {"ok": True, "output": {"text": "hello"}}
            refused = await agent.handle("search_tools", {"query": "x", "namespaces": ["nope"]})
            assert refused["ok"] is False and refused["error"]["code"] == "invalidRequest"

            # The providers' deferred loading over the same toolset: the search answers with
            # tool_reference blocks (Anthropic) or a tool_search_output (OpenAI Responses).
            deferred = await DeferredTools.open(run)
            loaded = await deferred.answer_anthropic(
                {
                    "id": "toolu_9",
                    "name": "search_tools",
                    "input": {"query": "send message", "namespaces": ["mail"]},
                }
            )
            assert loaded["content"][0] == {"type": "tool_reference", "tool_name": "mail__send_message"}
            conforms(ToolResultBlockParam, loaded)
            for ref in loaded["content"]:
                conforms(BetaToolReferenceBlockParam, ref)
            echoed = await deferred.answer_anthropic(
                {"id": "toolu_10", "name": "everything__echo", "input": {"text": "hi"}}
            )
            assert json.loads(echoed["content"]) == {"ok": True, "output": {"text": "hi"}}
            output = await deferred.answer_openai_tool_search(
                {"type": "tool_search_call", "call_id": "c1", "arguments": {"query": "delete message"}}
            )
            assert output["type"] == "tool_search_output" and output["tools"][0]["name"] == "mail"
            assert output["tools"][0]["tools"][0]["name"] == "delete_message"
            conforms(ResponseToolSearchOutputItemParamParam, output)
            answered = await deferred.answer_openai_function_call(
                {
                    "type": "function_call",
                    "call_id": "c2",
                    "namespace": "everything",
                    "name": "echo",
                    "arguments": '{"text": "yo"}',
                }
            )
            assert answered["type"] == "function_call_output"
            conforms(FunctionCallOutput, answered)
            assert json.loads(answered["output"]) == {"ok": True, "output": {"text": "yo"}}
