"""Schemas and names that declaration generators get wrong, as one toolset (`edge_tools()`)."""

from __future__ import annotations

from typing import Any

from toolbus_contracts import EffectivePolicy, ToolInfo

OBJ = "object"


def _o(props: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": OBJ, "properties": props, "required": required or [], **extra}


EDGE_SCHEMAS: dict[str, dict[str, Any]] = {
    "refs_defs": {
        "type": OBJ,
        "properties": {"a": {"$ref": "#/$defs/Addr"}, "b": {"$ref": "#/definitions/Legacy"}},
        "required": ["a"],
        "additionalProperties": False,
        "$defs": {"Addr": _o({"street": {"type": "string"}}, ["street"], additionalProperties=False)},
        "definitions": {"Legacy": {"type": "integer"}},
    },
    "recursive_tree": {
        "type": OBJ,
        "properties": {"root": {"$ref": "#/$defs/Node"}},
        "required": ["root"],
        "additionalProperties": False,
        "$defs": {
            "Node": _o(
                {
                    "name": {"type": "string"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                },
                ["name"],
                additionalProperties=False,
            )
        },
    },
    "recursive_root": _o(
        {"value": {"type": "number"}, "next": {"$ref": "#"}}, ["value"], additionalProperties=False
    ),
    "mutual_direct_cycle": {
        "type": OBJ,
        "properties": {"x": {"$ref": "#/$defs/A"}},
        "$defs": {
            "A": {"anyOf": [{"$ref": "#/$defs/B"}, {"type": "string"}]},
            "B": {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "number"}]},
        },
    },
    "all_of_beside_properties": {
        "type": OBJ,
        "properties": {"id": {"type": "string"}},
        "required": ["id"],
        "allOf": [_o({"n": {"type": "integer"}}, ["n"])],
    },
    "any_of_beside_properties": {
        "type": OBJ,
        "properties": {"email": {"type": "string"}, "phone": {"type": "string"}},
        "additionalProperties": False,
        "anyOf": [{"required": ["email"]}, {"required": ["phone"]}],
    },
    "one_of_variants": {
        "type": OBJ,
        "properties": {
            "shape": {
                "oneOf": [
                    _o(
                        {"kind": {"const": "circle"}, "r": {"type": "number"}},
                        ["kind", "r"],
                        additionalProperties=False,
                    ),
                    _o(
                        {"kind": {"const": "square"}, "side": {"type": "number"}},
                        ["kind", "side"],
                        additionalProperties=False,
                    ),
                ]
            }
        },
        "required": ["shape"],
    },
    "enum_const_null": _o(
        {
            "state": {"type": "string", "enum": ["open", "closed"]},
            "mode": {"const": "fast"},
            "maybe": {"type": ["string", "null"]},
            "nullable_openapi": {"type": "integer", "nullable": True},
            "mixed_enum": {"enum": ["a", 1, None, True]},
        },
        ["state"],
        additionalProperties=False,
    ),
    "arrays_of_unions": _o(
        {
            "labels": {"type": "array", "items": {"enum": ["bug", "feature"]}},
            "ids": {"type": "array", "items": {"type": ["string", "integer"]}},
            "things": {
                "type": "array",
                "items": {"anyOf": [{"type": "string"}, _o({"k": {"type": "string"}})]},
            },
        },
        ["labels"],
        additionalProperties=False,
    ),
    "tuples": _o(
        {
            "point": {
                "type": "array",
                "prefixItems": [{"type": "number"}, {"type": "number"}],
                "items": False,
                "minItems": 2,
            },
            "head_rest": {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"}},
            "draft7": {
                "type": "array",
                "items": [{"type": "string"}, {"type": "boolean"}],
                "additionalItems": False,
            },
        },
        ["point"],
        additionalProperties=False,
    ),
    "open_closed_schema_objects": _o(
        {
            "open": _o({"a": {"type": "string"}}),
            "open_true": _o({"a": {"type": "string"}}, additionalProperties=True),
            "closed": _o({"a": {"type": "string"}}, additionalProperties=False),
            "map": {"type": OBJ, "additionalProperties": {"type": "integer"}},
            "map_with_named": _o({"name": {"type": "string"}}, additionalProperties={"type": "integer"}),
            "patterned": {
                "type": OBJ,
                "patternProperties": {"^x-": {"type": "string"}},
                "additionalProperties": False,
            },
            "required_unlisted": {"type": OBJ, "required": ["ghost"]},
        },
        ["closed"],
        additionalProperties=False,
    ),
    "docs_defaults_formats": _o(
        {
            "when": {
                "type": "string",
                "format": "date-time",
                "description": "When it happens. Ends with */ here.",
            },
            "count": {"type": "integer", "default": 10, "minimum": 1},
            "old": {"type": "boolean", "deprecated": True, "description": "Use `new` instead."},
        },
        [],
        additionalProperties=False,
    ),
    "schema_says_nothing": {
        "type": OBJ,
        "properties": {"anything": {}, "truthy": True},
        "required": ["anything"],
    },
    "no_properties_at_all": {"type": OBJ},
    "weird_keys": _o(
        {
            "class": {"type": "string"},
            "new": {"type": "string"},
            "with-dash": {"type": "string"},
            "1st": {"type": "string"},
            "ünï": {"type": "string"},
            'quote"d': {"type": "string"},
            "": {"type": "string"},
        },
        ["class", "with-dash"],
        additionalProperties=False,
    ),
}

# Tool names that are not identifiers, and pairs that sanitize to the same identifier.
TRICKY_NAMES = [
    "API-get-user",
    "API_get_user",
    "get.file",
    "class",
    "new",
    "constructor",
    "1st",
    "ünïcode",
    "toString",
    "__proto__x",
    "$weird",
    "a b",
]

# Schemas that are not valid JSON Schema: rendering degrades to JsonValue, never crashes.
INVALID_SCHEMAS: dict[str, Any] = {
    "bad_type": {"type": "strnig", "properties": {"a": {"type": 5}}},
    "bad_required": {"type": OBJ, "properties": {"a": {"type": "string"}}, "required": "a"},
    "bad_properties": {"type": OBJ, "properties": ["a"]},
    "dangling_ref": {
        "type": OBJ,
        "properties": {"a": {"$ref": "#/$defs/Missing"}, "b": {"$ref": "https://x/y"}},
    },
    "bad_items": {"type": "array", "items": 7},
    "deep": {"type": OBJ, "properties": {"d": {"$ref": "#/$defs/D0"}}},
}


def _deep() -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(200):
        schema = {"type": OBJ, "properties": {"x": schema}}
    return schema


def edge_tools() -> list[ToolInfo]:
    """The edge-case toolset: constructs, tricky names, host tools with and without group,
    `http`/`workflows` tools, a namespace that shares a name with a top-level tool."""
    policy = EffectivePolicy()
    tools = [
        ToolInfo(
            name=f"edge.{name}",
            kind="mcp",
            description=f"Edge case {name}. Second sentence.",
            input_schema=schema,
            policy=policy,
        )
        for name, schema in EDGE_SCHEMAS.items()
    ]
    simple = _o({"q": {"type": "string"}}, ["q"], additionalProperties=False)
    tools += [
        ToolInfo(name=f"odd.{name}", kind="mcp", description="", input_schema=simple, policy=policy)
        for name in TRICKY_NAMES
    ]
    tools += [
        ToolInfo(
            name="edge.with_output",
            kind="mcp",
            description="Has an outputSchema.",
            input_schema=simple,
            output_schema=_o(
                {"total": {"type": "integer"}, "items": {"type": "array", "items": {"$ref": "#/$defs/I"}}},
                ["total"],
                **{"$defs": {"I": _o({"id": {"type": "string"}})}},
            ),
            policy=policy,
        ),
        ToolInfo(name="edge.deep_nesting", kind="mcp", input_schema=_o({"d": _deep()}), policy=policy),
        ToolInfo(
            name="ask_user",
            kind="host",
            description="Ask the end user a question.",
            input_schema=simple,
            output_schema=_o({"answer": {"type": "string"}}, ["answer"]),
            policy=policy,
        ),
        ToolInfo(
            name="crm.find_customer",
            kind="host",
            description="Find a customer.",
            input_schema=simple,
            policy=policy,
        ),
        ToolInfo(
            name="crm",
            kind="host",
            description="A top-level tool named like a namespace.",
            input_schema=simple,
            policy=policy,
        ),
        ToolInfo(
            name="JsonValue",
            kind="host",
            description="Named like a shared type.",
            input_schema=simple,
            policy=policy,
        ),
        ToolInfo(
            name="http.fetch",
            kind="http",
            description="Fetch a URL from an allowed host.",
            input_schema=_o(
                {"url": {"type": "string"}, "method": {"enum": ["GET", "POST"]}},
                ["url"],
                additionalProperties=False,
            ),
            output_schema=_o({"status": {"type": "integer"}, "body": {"type": "string"}}, ["status", "body"]),
            policy=policy,
        ),
        ToolInfo(
            name="workflows.triage",
            kind="workflow",
            description="Triage an issue.",
            input_schema=_o({"issue": {"type": "integer"}}, ["issue"]),
            policy=policy,
        ),
    ]
    tools += [
        ToolInfo(name=f"broken.{name}", kind="mcp", input_schema=schema, policy=policy)
        for name, schema in INVALID_SCHEMAS.items()
    ]
    return tools
