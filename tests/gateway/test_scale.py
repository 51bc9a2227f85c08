"""Large toolsets offered as search_tools/list_tools/call_tool, and 1,000 calls from 50 MCP
clients at once through one gateway, each answered exactly once."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from mcp.shared.exceptions import MCPError
from toolbus_contracts.catalogue import CATALOGUE_CHARS, SEARCH_GUIDE

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
        scoped = await client.call_tool("search_tools", {"query": "echo the text", "namespaces": ["gated"]})
        stray = await client.call_tool("search_tools", {"query": "echo", "namespaces": ["gated", "nope"]})
        namespaces = await client.call_tool("list_tools", {})
        pages = [await client.call_tool("list_tools", {"namespace": "many"})]
        while (pages[-1].structured_content or {}).get("nextCursor"):
            cursor = pages[-1].structured_content["nextCursor"]
            pages.append(await client.call_tool("list_tools", {"namespace": "many", "cursor": cursor}))
        unknown_namespace = await client.call_tool("list_tools", {"namespace": "nope"})
        called = await client.call_tool("call_tool", {"name": "shop.echo", "arguments": {"text": "via meta"}})
        unknown = await client.call_tool("call_tool", {"name": "shop.nope", "arguments": {}})
    assert [t.name for t in listed.tools] == ["search_tools", "list_tools", "call_tool"]
    description = listed.tools[0].description or ""
    assert "Namespaces:\n- gated (mcp, 3 tools): " in description
    assert "\n- many (mcp, 12 tools): " in description and "\n- shop (mcp, 3 tools): " in description
    assert listed.tools[0].input_schema["properties"]["namespaces"]["type"] == "array"
    assert found.structured_content is not None
    hits = found.structured_content["tools"]
    assert 1 <= len(hits) <= 3 and "shop.echo" in [h["name"] for h in hits]
    echo = next(h for h in hits if h["name"] == "shop.echo")
    assert echo["namespace"] == "shop" and echo["inputSchema"]["required"] == ["text"]
    assert scoped.structured_content is not None and scoped.structured_content["tools"]
    assert {h["namespace"] for h in scoped.structured_content["tools"]} == {"gated"}
    assert stray.is_error is True and "namespaces[1]" in stray.content[0].text  # type: ignore[union-attr]
    assert namespaces.structured_content == {
        "namespaces": [
            {
                "name": n,
                "kind": "mcp",
                "toolCount": c,
                "summary": namespaces.structured_content["namespaces"][i]["summary"],
            }
            for i, (n, c) in enumerate([("gated", 3), ("many", 12), ("shop", 3)])
        ]
    }
    assert [len(p.structured_content["tools"]) for p in pages] == [5, 5, 2]
    lines = [line for p in pages for line in p.structured_content["tools"]]
    assert all(line.startswith(f"many.op_{i:04d}") for i, line in enumerate(lines)), lines
    assert unknown_namespace.is_error is True
    assert called.structured_content == {"text": "via meta"}
    assert unknown.is_error is True
    # Without ?tools=, this 18-tool toolset is under the size limit (50): all tools are listed.
    async with mcp_client(deployment.url(toolset), token) as client:
        assert len((await client.list_tools()).tools) == 5


async def test_hundreds_of_namespaces_are_a_bounded_catalogue(deployment: Deployment) -> None:
    """300 namespaces (host groups), over the size setting without asking: the catalogue in
    search_tools' description stays within its bound and names the rest; list_tools pages every
    namespace; a search scoped to one finds its tool."""
    schema = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
    spec = {
        "host": [
            {
                "name": f"svc{i:03d}.fetch_widget",
                "description": f"Fetch a widget of service {i}.",
                "inputSchema": schema,
            }
            for i in range(300)
        ]
    }
    toolset: str = (await deployment.ok(deployment.subjects.toolsets_create, spec, within=120))["id"]
    token = await deployment.token([toolset])
    async with mcp_client(deployment.url(toolset), token, mode="legacy") as client:
        listed = await client.list_tools()
        names: list[str] = []
        cursor: str | None = None
        while True:
            page = await client.call_tool("list_tools", {"cursor": cursor} if cursor else {})
            assert page.structured_content is not None, page
            names += [n["name"] for n in page.structured_content["namespaces"]]
            cursor = page.structured_content.get("nextCursor")
            if cursor is None:
                break
        scoped = await client.call_tool(
            "search_tools", {"query": "fetch widget", "namespaces": ["svc123"], "limit": 5}
        )
        one = await client.read_resource(f"toolbus://toolsets/{toolset}/namespaces/svc123/declarations.txt")
    assert [t.name for t in listed.tools] == ["search_tools", "list_tools", "call_tool"]
    description = listed.tools[0].description or ""
    assert len(description) <= len(SEARCH_GUIDE) + 2 + CATALOGUE_CHARS
    assert "- svc000 (host, 1 tools): " in description and "more namespaces" in description
    assert names == [f"svc{i:03d}" for i in range(300)]
    assert scoped.structured_content is not None
    assert [h["name"] for h in scoped.structured_content["tools"]] == ["svc123.fetch_widget"]
    text = one.contents[0].text  # type: ignore[union-attr]
    assert text.strip().startswith("svc123.fetch_widget") and len(text.strip().splitlines()) == 1


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
        first = await client.list_resources()
        rest = await client.list_resources(cursor=first.next_cursor)
        templates = await client.list_resource_templates()
        prompt = await client.read_resource(f"toolbus://toolsets/{toolset}/declarations.txt")
        dts = await client.read_resource(f"toolbus://toolsets/{toolset}/declarations.d.ts")
        many = await client.read_resource(f"toolbus://toolsets/{toolset}/namespaces/many/declarations.txt")
        many_dts = await client.read_resource(
            f"toolbus://toolsets/{toolset}/namespaces/many/declarations.d.ts"
        )
        missing = []
        for uri in ("nothing", "namespaces/nope/declarations.txt", "namespaces/many/other.txt"):
            with pytest.raises(MCPError) as raised:
                await client.read_resource(f"toolbus://toolsets/{toolset}/{uri}")
            missing.append(raised.value.error.code)
    base = f"toolbus://toolsets/{toolset}"
    assert [str(r.uri) for r in [*first.resources, *rest.resources]] == [
        f"{base}/declarations.txt",
        f"{base}/declarations.d.ts",
        *(
            f"{base}/namespaces/{n}/{f}"
            for n in ("gated", "many", "shop")
            for f in ("declarations.txt", "declarations.d.ts")
        ),
    ]
    assert rest.next_cursor is None
    assert [t.uri_template for t in templates.resource_templates] == [
        f"{base}/namespaces/{{namespace}}/declarations.txt",
        f"{base}/namespaces/{{namespace}}/declarations.d.ts",
    ]
    prompt_text = prompt.contents[0].text  # type: ignore[union-attr]
    assert len(prompt_text.strip().splitlines()) == 18 and "shop.echo" in prompt_text
    dts_text = dts.contents[0].text  # type: ignore[union-attr]
    assert 'declare module "rewind:tools"' in dts_text and "export const shop" in dts_text
    many_lines = many.contents[0].text.strip().splitlines()  # type: ignore[union-attr]
    assert len(many_lines) == 12 and all(line.startswith("many.op_") for line in many_lines)
    assert "export const many" in many_dts.contents[0].text  # type: ignore[union-attr]
    assert "export const shop" not in many_dts.contents[0].text  # type: ignore[union-attr]
    assert missing == [-32002, -32002, -32002]
