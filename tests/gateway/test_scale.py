"""Large toolsets offered as search_tools/list_tools/call_tool, and 1,000 calls from 50 MCP
clients at once through one gateway, each answered exactly once."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from mcp.shared.exceptions import MCPError

from tests.gateway.conftest import Deployment, mcp_client
from tests.support.mcp_servers import McpTestServer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def test_large_toolset_mode_searches_lists_and_calls(
    deployment: Deployment, toolset: str, mcp_servers: dict[str, McpTestServer]
) -> None:
    token = await deployment.token([toolset])
    async with mcp_client(deployment.url(toolset, "?tools=search"), token) as client:
        listed = await client.list_tools()
        found = await client.call_tool("search_tools", {"query": "echo the text", "limit": 3})
        page = await client.call_tool("list_tools", {})
        called = await client.call_tool("call_tool", {"name": "shop.echo", "arguments": {"text": "via meta"}})
        unknown = await client.call_tool("call_tool", {"name": "shop.nope", "arguments": {}})
    assert [t.name for t in listed.tools] == ["search_tools", "list_tools", "call_tool"]
    assert found.structured_content is not None
    hits = found.structured_content["tools"]
    assert 1 <= len(hits) <= 3 and "shop.echo" in [h["name"] for h in hits]
    assert next(h for h in hits if h["name"] == "shop.echo")["inputSchema"]["required"] == ["text"]
    assert page.structured_content is not None and len(page.structured_content["tools"]) == 5
    assert page.structured_content["nextCursor"] == "5"
    assert called.structured_content == {"text": "via meta"}
    assert unknown.is_error is True
    # Without ?tools=, this 18-tool toolset is under the size limit (50): all tools are listed.
    async with mcp_client(deployment.url(toolset), token) as client:
        assert len((await client.list_tools()).tools) == 5


async def test_thousand_calls_from_fifty_clients_each_answered_once(
    deployment: Deployment, toolset: str, mcp_servers: dict[str, McpTestServer]
) -> None:
    token = await deployment.token([toolset], namespace="load-user")
    shop = mcp_servers["shop"]
    before = len(shop.calls_to("echo"))

    async def one_client(c: int) -> list[str]:
        texts = []
        mode = "legacy" if c % 2 else "auto"
        async with mcp_client(deployment.url(toolset), token, mode=mode) as client:
            for i in range(20):
                result = await client.call_tool("shop.echo", {"text": f"c{c}-{i}"})
                assert result.is_error is False, result
                assert result.structured_content is not None
                texts.append(result.structured_content["text"])
        return texts

    results = await asyncio.wait_for(asyncio.gather(*(one_client(c) for c in range(50))), 300)
    answered = [t for texts in results for t in texts]
    assert sorted(answered) == sorted(f"c{c}-{i}" for c in range(50) for i in range(20))
    sent = Counter(r.arguments["text"] for r in shop.calls_to("echo")[before:])
    assert len(sent) == 1000 and set(sent.values()) == {1}


async def test_declarations_are_resources(deployment: Deployment, toolset: str) -> None:
    token = await deployment.token([toolset])
    async with mcp_client(deployment.url(toolset), token, mode="legacy") as client:
        listed = await client.list_resources()
        uris = [str(r.uri) for r in listed.resources]
        prompt = await client.read_resource(f"toolbus://toolsets/{toolset}/declarations.txt")
        dts = await client.read_resource(f"toolbus://toolsets/{toolset}/declarations.d.ts")
        with pytest.raises(MCPError) as missing:
            await client.read_resource(f"toolbus://toolsets/{toolset}/nothing")
    assert uris == [
        f"toolbus://toolsets/{toolset}/declarations.txt",
        f"toolbus://toolsets/{toolset}/declarations.d.ts",
    ]
    prompt_text = prompt.contents[0].text  # type: ignore[union-attr]
    assert len(prompt_text.strip().splitlines()) == 18 and "shop.echo" in prompt_text
    dts_text = dts.contents[0].text  # type: ignore[union-attr]
    assert 'declare module "rewind:tools"' in dts_text and "export const shop" in dts_text
    assert missing.value.error.code == -32002
