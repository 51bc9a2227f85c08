"""Declarations as pure functions: layout, names, determinism, prompt lines, and robustness."""

from __future__ import annotations

import random
from typing import Any

from toolbus_contracts import EffectivePolicy, ToolInfo
from toolbus_registry.declarations import render_dts, render_prompt, tool_dts_fragment, tool_prompt_line

from tests.tsc.edge_cases import INVALID_SCHEMAS, edge_tools

P = EffectivePolicy()


def _tool(name: str, schema: dict[str, Any] | None = None, **kw: Any) -> ToolInfo:
    return ToolInfo(
        name=name,
        kind=kw.pop("kind", "mcp"),
        input_schema=schema or {"type": "object"},
        policy=P,
        **kw,
    )


def test_same_tools_in_any_order_give_the_same_bytes() -> None:
    tools = edge_tools()
    shuffled = tools[:]
    random.Random(7).shuffle(shuffled)
    assert render_dts(tools, "rewind:tools") == render_dts(shuffled, "rewind:tools")
    assert render_prompt(tools) == render_prompt(shuffled)


def test_module_name_is_the_parameter_and_namespaces_are_exported_values() -> None:
    dts = render_dts(
        [_tool("github.list_issues"), _tool("notion.API-get-user"), _tool("ask_user", kind="host")],
        "acme:tools",
    )
    assert 'declare module "acme:tools" {' in dts
    assert "export const github: {" in dts
    assert "    list_issues(input: " in dts
    assert '    "API-get-user"(input: ' in dts
    assert "export function ask_user(input: " in dts


def test_mcp_tool_without_output_schema_returns_content_blocks_and_others_json() -> None:
    dts = render_dts([_tool("s.a"), _tool("h.b", kind="host")], "m")
    assert "a(input: { [key: string]: JsonValue }): Promise<{ content: ContentBlock[] }>;" in dts
    assert "b(input: { [key: string]: JsonValue }): Promise<JsonValue>;" in dts


def test_description_appears_once_and_property_descriptions_on_properties() -> None:
    schema = {
        "type": "object",
        "properties": {"owner": {"type": "string", "description": "Repo owner"}},
        "required": ["owner"],
        "additionalProperties": False,
    }
    dts = render_dts([_tool("g.t", schema, description="Unique tool text.")], "m")
    assert dts.count("Unique tool text.") == 1
    assert "/** Repo owner */\n" in dts


def test_arrays_of_unions_are_parenthesised_and_sibling_anyof_keeps_properties() -> None:
    schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "l": {"type": "array", "items": {"enum": ["a", "b"]}},
            "e": {"type": "string"},
            "p": {"type": "string"},
        },
        "anyOf": [{"required": ["e"]}, {"required": ["p"]}],
    }
    dts = render_dts([_tool("g.t", schema)], "m")
    assert '("a" | "b")[]' in dts
    assert (
        '{ l?: ("a" | "b")[]; e: string; p?: string } | { l?: ("a" | "b")[]; e?: string; p: string }' in dts
    )
    assert "unknown" not in dts
    assert "any;" not in dts


def test_recursive_refs_become_named_types_in_the_tool_namespace() -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"$ref": "#/$defs/Node"}},
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
            }
        },
    }
    dts = render_dts([_tool("g.tree", schema)], "m")
    assert "export namespace $g {" in dts
    assert "export type Node = { kids?: $g.tree.Node[];" in dts


def test_tool_names_that_sanitize_alike_get_distinct_type_namespaces() -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"$ref": "#/$defs/N"}},
        "$defs": {"N": {"type": "string"}},
    }
    dts = render_dts([_tool("g.a-b", schema), _tool("g.a_b", schema)], "m")
    assert "export namespace a_b {" in dts
    assert "export namespace a_b_2 {" in dts


def test_invalid_schemas_degrade_without_raising() -> None:
    for name, schema in INVALID_SCHEMAS.items():
        dts = render_dts([_tool(f"b.{name}", schema)], "m")
        assert f"{name}(input:" in dts
        assert tool_prompt_line(_tool(f"b.{name}", schema)).startswith(f"b.{name}(")
    weird: object
    for weird in ([], "x", 5, None, {"type": ["object", 3]}, {"properties": {"a": None}}, {"enum": "x"}):
        render_dts([_tool("b.w", {"type": "object", "properties": {"a": weird}})], "m")


def test_prompt_line_shows_name_params_optional_marks_result_and_first_sentence() -> None:
    schema = {
        "type": "object",
        "properties": {
            "owner": {"type": "string"},
            "state": {"enum": ["open", "closed"]},
            "labels": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["owner"],
    }
    line = tool_prompt_line(_tool("github.list_issues", schema, description="List issues. Paginated."))
    assert line == (
        'github.list_issues(owner: string, state?: "open"|"closed", labels?: string[])'
        " -> {content: ContentBlock[]} -- List issues."
    )


def test_prompt_is_sorted_one_line_per_tool() -> None:
    prompt = render_prompt([_tool("b.z"), _tool("a.y"), _tool("b.a")])
    assert [line.split("(")[0] for line in prompt.splitlines()] == ["a.y", "b.a", "b.z"]


def test_fragment_is_the_tool_alone_with_its_named_types() -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"$ref": "#/$defs/N"}},
        "$defs": {"N": {"type": "string"}},
    }
    fragment = tool_dts_fragment(_tool("notion.API-get-user", schema, description="Get a user."))
    assert fragment.startswith("declare namespace $notion {")
    assert 'declare const notion: {\n  /** Get a user. */\n  "API-get-user"(input:' in fragment
    assert tool_dts_fragment(_tool("ask_user", kind="host")).startswith("declare function ask_user(")


def test_the_size_floor_never_exceeds_the_rendered_size() -> None:
    import orjson
    from toolbus_registry.declarations import declarations_floor

    from tests.support.mcp_servers import synthetic_tools

    synthetic = [
        _tool(f"srv.{t['name']}", t["inputSchema"], description=t["description"]) for t in synthetic_tools(30)
    ]
    for tools in (edge_tools(), synthetic, [_tool("a", description="  x \n\n y */ z  ")], [_tool("b")]):
        size = len(orjson.dumps({"prompt": render_prompt(tools), "dts": render_dts(tools, "m")}))
        assert 0 < declarations_floor((t.name, t.description) for t in tools) <= size


def test_a_scalar_type_beside_a_shaping_keyword_is_rendered_by_that_keyword() -> None:
    """Plain scalars take a shortcut in both renderers; `const`, `enum`, `nullable`, `$ref` and
    the combinators beside a scalar `type` must still shape the type as the full walk does (the
    compact prompt reads a combinator only where no type is named)."""
    properties: dict[str, Any] = {
        "plain": {"type": "integer", "description": "A count.", "format": "int32", "minimum": 0},
        "nullable": {"type": "string", "nullable": True},
        "not_nullable": {"type": "string", "nullable": False},
        "const": {"type": "string", "const": "x"},
        "enum": {"type": "string", "enum": ["a", "b", 3]},
        "any_of": {"type": "string", "anyOf": [{"maxLength": 3}, {"const": "long"}]},
        "all_of": {"type": "number", "allOf": [{"const": 1}]},
        "ref": {"type": "string", "$ref": "#/$defs/Mode"},
    }
    schema = {"type": "object", "properties": properties, "$defs": {"Mode": {"enum": ["on", "off"]}}}
    line = tool_prompt_line(_tool("s.t", schema))
    assert line.startswith(
        's.t(plain?: integer, nullable?: string|null, not_nullable?: string, "const"?: "x", '
        '"enum"?: "a"|"b"|3, any_of?: string, all_of?: number, ref?: "on"|"off")'
    )
    dts = render_dts([_tool("s.t", schema)], "rewind:tools")
    for member in (
        "plain?: number;",
        "nullable?: string | null;",
        "not_nullable?: string;",
        '"const"?: "x";',
        '"enum"?: "a" | "b";',
        'any_of?: string & (string | "long");',
        "all_of?: number & 1;",
        "ref?: $s.t.Mode & string;",
    ):
        assert member in dts, member
