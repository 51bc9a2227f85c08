"""The agent tools' definitions in each provider's documented shape, checked against the
providers' own SDK types (anthropic's and openai's TypedDicts, mcp_types' `Tool`), and the
catalogue in `search_tools`' description bounded for toolsets of hundreds of namespaces. (The
answers' shapes are checked where they are made, against the real stack:
tests/sdk/test_outputs_and_agent.py.)"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import mcp_types
import pytest
from anthropic.types import ToolParam
from openai.types.chat import ChatCompletionFunctionToolParam
from openai.types.responses import NamespaceToolParam, ToolSearchToolParam
from openai.types.responses.namespace_tool_param import ToolFunction
from pydantic import TypeAdapter
from toolbus.agent import (
    CATALOGUE_CHARS,
    AgentTools,
    DeferredTools,
    api_name,
    catalogue_text,
)
from toolbus_contracts import EffectivePolicy, NamespaceInfo, ToolInfo

API_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""A tool's name as both APIs document it (letters, digits, `_` and `-`, at most 64)."""


def conforms(typed: Any, value: Any) -> None:
    """`value` validates as the provider's TypedDict and holds no key it does not declare."""
    TypeAdapter(typed).validate_python(value)
    declared = typed.__required_keys__ | typed.__optional_keys__
    assert set(value) <= declared, set(value) - declared
    assert typed.__required_keys__ <= set(value), typed.__required_keys__ - set(value)


@dataclass
class _Run:
    """What `AgentTools` reads of a run for its definitions (no call is made here)."""

    toolset_id: str = "ts_" + "0" * 64


def _namespaces(n: int) -> list[NamespaceInfo]:
    return [
        NamespaceInfo(
            name=f"service_{i:03d}_api",
            kind="mcp",
            tool_count=10 + i % 40,
            summary=f"list, get, create, update, delete: widget {i}, gadget {i}, sprocket {i} (+{i % 9} more)",
            summary_source="derived",
        )
        for i in range(n)
    ]


def _tools() -> list[ToolInfo]:
    policy = EffectivePolicy.for_kind("mcp", None)
    schema = {"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]}
    names = ["mail.send_message", "mail.list_messages", "crm.find_customer", "ask_user", "odd.tool.with-dots"]
    return [
        ToolInfo(name=n, kind="mcp", description=f"{n} does it.", input_schema=schema, policy=policy)
        for n in names
    ]


def test_the_catalogue_of_500_namespaces_stays_within_its_bound() -> None:
    namespaces = _namespaces(500)
    text = catalogue_text(namespaces)
    assert len(text) <= CATALOGUE_CHARS
    assert text.startswith("Namespaces:\n- service_000_api (mcp, 10 tools): list, get")
    shown = text.count("\n- ")
    assert 20 <= shown < 500
    assert "Also: " in text
    named = len(re.findall(r"service_\d{3}_api", text))
    more = int(re.search(r"\(and (\d+) more namespaces", text).group(1))  # type: ignore[union-attr]
    assert named + more == 500
    agent = AgentTools(_Run(), catalogue=namespaces)  # type: ignore[arg-type]
    description = agent.anthropic()[0]["description"]
    assert len(description) <= CATALOGUE_CHARS + 1000 and "service_000_api" in description


def test_a_small_catalogue_is_shown_whole() -> None:
    namespaces = _namespaces(12)
    text = catalogue_text(namespaces)
    assert text.count("\n- ") == 12 and "more namespaces" not in text and "Also" not in text


def test_agent_tools_in_the_anthropic_openai_and_mcp_shapes() -> None:
    agent = AgentTools(_Run(), catalogue=_namespaces(3))  # type: ignore[arg-type]
    assert [t["name"] for t in agent.anthropic()] == ["search_tools", "list_tools", "call_tool"]
    for tool in agent.anthropic():
        conforms(ToolParam, tool)
        assert API_NAME.fullmatch(tool["name"]) and tool["input_schema"]["type"] == "object"
    for tool in agent.openai():
        conforms(ChatCompletionFunctionToolParam, tool)
        assert API_NAME.fullmatch(tool["function"]["name"])
    for tool in agent.mcp():
        parsed = mcp_types.Tool.model_validate(tool)
        assert parsed.name == tool["name"] and parsed.input_schema["type"] == "object"
    search = agent.anthropic()[0]
    assert "service_002_api" in search["description"]
    assert search["input_schema"]["properties"]["namespaces"]["items"] == {"type": "string"}


def test_deferred_tools_in_the_anthropic_tool_search_shape() -> None:
    agent = AgentTools(_Run(), catalogue=_namespaces(2))  # type: ignore[arg-type]
    deferred = DeferredTools(agent, _tools())
    tools = deferred.anthropic()
    assert tools[0]["name"] == "search_tools" and "defer_loading" not in tools[0]
    for definition in tools:
        conforms(ToolParam, definition)
        assert API_NAME.fullmatch(definition["name"]), definition["name"]
    assert all(t["defer_loading"] is True for t in tools[1:])
    names = [t["name"] for t in tools[1:]]
    assert len(set(names)) == len(names) == 5
    for tool in _tools():
        assert deferred.qualified(api_name(tool.name)) == tool.name


def test_deferred_tools_in_the_openai_responses_tool_search_shape() -> None:
    agent = AgentTools(_Run(), catalogue=_namespaces(2))  # type: ignore[arg-type]
    deferred = DeferredTools(agent, _tools())
    search, *namespaces = deferred.openai_responses()
    conforms(ToolSearchToolParam, search)
    assert search["execution"] == "client" and "service_001_api" in search["description"]
    assert sorted(n["name"] for n in namespaces) == ["ask_user", "crm", "mail", "odd"]
    for namespace in namespaces:
        conforms(NamespaceToolParam, namespace)
        assert API_NAME.fullmatch(namespace["name"])
        for function in namespace["tools"]:
            conforms(ToolFunction, function)
            assert API_NAME.fullmatch(function["name"]) and function["defer_loading"] is True
    mail = next(n for n in namespaces if n["name"] == "mail")
    assert deferred.qualified(mail["tools"][0]["name"], "mail") in {"mail.send_message", "mail.list_messages"}
    assert deferred.qualified("tool__with-dots", "odd") == "odd.tool.with-dots"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("github.list_issues", "github__list_issues"),
        ("ask_user", "ask_user"),
        ("a.b c", "a__b_c"),
    ],
)
def test_api_names(name: str, expected: str) -> None:
    assert api_name(name) == expected


def test_a_long_name_is_cut_with_a_hash_and_stays_distinct() -> None:
    a, b = api_name("s." + "x" * 80 + "a"), api_name("s." + "x" * 80 + "b")
    assert API_NAME.fullmatch(a) and API_NAME.fullmatch(b) and a != b
