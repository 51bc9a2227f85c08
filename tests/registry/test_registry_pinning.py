"""Pinning without a broker: the fast serialisations give exactly what the models' own `wire()`
gives, and a listed tool that cannot be pinned is refused naming its server."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import pytest
from toolbus_common.canonical import canonical_json, content_id
from toolbus_common.toolsets import ToolTable
from toolbus_contracts import (
    HostToolSpec,
    HttpSpec,
    McpServerSpec,
    PinnedServer,
    PinnedToolset,
    PolicySpec,
    ToolInfo,
    ToolsetCreateRequest,
    Workflow,
)
from toolbus_contracts.errors import InvalidRequest
from toolbus_registry.pinning import Pinned, Pinner, ServerListing, toolset_id

from tests.support.mcp_servers import synthetic_tools

PAGE = 1024 * 1024 - 4096
"""What one toolsets.get page carries on a default NATS server."""

SCHEMA = {"type": "object", "properties": {"n": {"type": "number", "minimum": 0.5, "maximum": 1e21}}}


def _lister(listings: dict[str, list[dict[str, Any]]]) -> Any:
    async def lister(server: str, url: str, headers: Mapping[str, str]) -> ServerListing:
        return ServerListing(listings[server])

    return lister


async def _nothing(*_: Any) -> None:
    return None


async def _workflow(name: str, version: str | None) -> Workflow:
    return Workflow(name=name, version="0" * 12, input_schema=SCHEMA, output_schema=SCHEMA)


def _rich_spec() -> ToolsetCreateRequest:
    return ToolsetCreateRequest(
        mcp=[
            McpServerSpec(name="b", url="http://b/mcp", policies={"op_0000": PolicySpec(approval=True)}),
            McpServerSpec(name="a", url="http://a/mcp"),
        ],
        host=[
            HostToolSpec(name="crm.find", description="Find. 😀", input_schema=SCHEMA, output_schema=SCHEMA),
            HostToolSpec(name="ask", input_schema={"type": "object"}, policy=PolicySpec(concurrency=2)),
        ],
        http=HttpSpec(allow=["API.example.com.", "*.example.com"], policy=PolicySpec(timeout="30s")),
        workflows=["triage"],
    )


async def _rich_pinned() -> Pinned:
    tools = [
        *synthetic_tools(20),
        {"name": "floaty", "title": "F", "inputSchema": SCHEMA, "annotations": {"readOnlyHint": True}},
    ]
    pinner = Pinner(_lister({"a": tools, "b": synthetic_tools(5)}), _workflow, _nothing, page_bytes=PAGE)
    return await pinner.pin(_rich_spec())


async def test_the_assembled_wire_form_is_the_models_and_gives_its_id() -> None:
    pinned = await _rich_pinned()
    assert pinned.wire == pinned.toolset.wire()
    assert pinned.canonical == canonical_json(pinned.wire)  # assembled from per-server parts
    assert pinned.id == toolset_id(pinned.toolset) == content_id("ts_", pinned.toolset.wire())
    # what is stored (the canonical JSON) validates back to the same toolset, so a stored one
    # keeps its id; so does the wire form a toolset stored before validates from
    for stored_json in (pinned.canonical, orjson.dumps(pinned.wire)):
        stored = PinnedToolset.model_validate_json(stored_json)
        assert toolset_id(stored) == pinned.id


async def test_the_store_gets_the_canonical_json_unless_it_rounded_an_integer() -> None:
    pinned = await _rich_pinned()
    assert pinned.stored_json() == pinned.canonical
    big = 2**53 + 1  # JCS writes it as the double 2**53
    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": big}}}
    pinner = Pinner(
        _lister({"a": [{"name": "t", "inputSchema": schema}]}), _workflow, _nothing, page_bytes=PAGE
    )
    exact = await pinner.pin(ToolsetCreateRequest(mcp=[McpServerSpec(name="a", url="http://a/mcp")]))
    assert exact.stored_json() != exact.canonical
    stored = PinnedToolset.model_validate_json(exact.stored_json())
    assert stored.servers[0].tools[0].input_schema["properties"]["n"]["maximum"] == big
    assert toolset_id(stored) == exact.id


RICH_TOOLSET_ID = "ts_c95275285f59e59a032b78be073d8cbcbeadae95098adc4825e48d274cf9e8fe"
"""The id of `_rich_pinned()` as main gave it before the registration-cost work (cd40079): ids are
content addresses that stored toolsets and clients hold, so no speed-up may change one."""


async def test_a_known_toolset_keeps_its_id() -> None:
    pinned = await _rich_pinned()
    assert pinned.id == RICH_TOOLSET_ID
    again = await _rich_pinned()  # a fresh pinner, and the same pinner again (its memo)
    assert again.id == RICH_TOOLSET_ID


async def test_tool_table_wire_forms_are_those_of_validated_infos() -> None:
    table = ToolTable((await _rich_pinned()).toolset)
    validated = [ToolInfo.model_validate(w) for w in table.wire()]
    assert table.wire() == [v.wire() for v in validated]
    assert [i.wire() for i in table.infos()] == [v.wire() for v in validated]
    assert {t.kind for t in table.tools} == {"mcp", "host", "http", "workflow"}
    tool = table.get("b.op_0000")
    assert tool is not None and tool.policy.approval and tool.info.policy == tool.policy


async def test_a_listed_tool_that_cannot_be_pinned_names_its_server() -> None:
    bad = {"name": "t", "title": 5, "inputSchema": {"type": "object"}}
    pinner = Pinner(_lister({"a": [bad]}), _nothing, _nothing, page_bytes=PAGE)
    with pytest.raises(InvalidRequest) as caught:
        await pinner.pin(ToolsetCreateRequest(mcp=[McpServerSpec(name="a", url="http://a/mcp")]))
    assert caught.value.details == {"field": "mcp[0].url", "server": "a"} and "'a'" in caught.value.message


@pytest.mark.parametrize(
    ("tools", "limit"),
    [
        ([{"name": "t", "inputSchema": {}}, {"name": "t", "inputSchema": {}}], None),  # the same name twice
        ([{"name": "L" * 254, "inputSchema": {}}], 256),  # "a." + 254 is 256: callable, but one more is not
    ],
)
async def test_a_listing_no_call_could_use_names_the_server_that_listed_it(
    tools: list[dict[str, Any]], limit: int | None
) -> None:
    pinner = Pinner(_lister({"a": tools}), _nothing, _nothing, page_bytes=PAGE)
    spec = ToolsetCreateRequest(mcp=[McpServerSpec(name="a", url="http://a/mcp")])
    if limit is not None:  # at the limit it pins; one character more is refused
        assert (await pinner.pin(spec)).toolset.servers[0].tools[0].name == "L" * 254
        tools[0] = {"name": "L" * 255, "inputSchema": {}}
    with pytest.raises(InvalidRequest) as caught:
        await pinner.pin(spec)
    assert caught.value.details["field"] == "mcp[0].url" and caught.value.details["server"] == "a"
    if limit is not None:
        assert caught.value.details["limit"] == limit and "over the 256 characters" in caught.value.message


async def test_a_server_listing_the_same_tools_again_is_pinned_once() -> None:
    listings = {"a": synthetic_tools(3)}
    pinner = Pinner(_lister(listings), _nothing, _nothing, page_bytes=PAGE)
    spec = ToolsetCreateRequest(mcp=[McpServerSpec(name="a", url="http://a/mcp")])
    first, again = await pinner.pin(spec), await pinner.pin(spec)
    assert again.toolset.servers[0] is first.toolset.servers[0] and again.id == first.id
    listings["a"] = synthetic_tools(4)
    changed = await pinner.pin(spec)
    assert changed.id != first.id and len(changed.toolset.servers[0].tools) == 4
    # the memo is keyed by policies too: a policy naming a tool not listed is still refused
    bad = ToolsetCreateRequest(
        mcp=[McpServerSpec(name="a", url="http://a/mcp", policies={"nope": PolicySpec(approval=True)})]
    )
    with pytest.raises(InvalidRequest):
        await pinner.pin(bad)


async def test_each_server_pinned_afresh_is_handed_over_as_soon_as_it_is() -> None:
    # The registry prepares a server's search terms while the others are still listed: each
    # server pinned afresh is handed over, one remembered from the same listing before is not.
    listings = {"a": synthetic_tools(3), "b": synthetic_tools(2)}
    pinner = Pinner(_lister(listings), _nothing, _nothing, page_bytes=PAGE)
    spec = ToolsetCreateRequest(
        mcp=[McpServerSpec(name="a", url="http://a/mcp"), McpServerSpec(name="b", url="http://b/mcp")]
    )
    handed: list[PinnedServer] = []
    pinned = await pinner.pin(spec, on_pinned=handed.append)
    assert sorted(s.name for s in handed) == ["a", "b"]
    assert {s.name: s for s in handed} == {s.name: s for s in pinned.toolset.servers}
    handed.clear()
    listings["b"] = synthetic_tools(4)
    await pinner.pin(spec, on_pinned=handed.append)
    assert [s.name for s in handed] == ["b"]  # a listed the same tools: remembered, not handed


async def test_a_tools_info_is_its_validated_wire_form() -> None:
    # `Tool.info` is made from the wire form without validating it again: it must be the model
    # validation gives, for every kind of tool.
    table = ToolTable((await _rich_pinned()).toolset)
    for tool in table.tools:
        validated = ToolInfo.model_validate({**tool.wire, "policy": tool.policy})
        assert tool.info == validated and tool.info.wire() == validated.wire() == tool.wire
