"""JSON Schema to TypeScript types, as tight as TypeScript can say and never tighter than the schema.

A value the schema accepts must type-check against the rendered type; a value it refuses should
not. Where a schema says nothing the type is `JsonValue`, never `any`. A schema that is not valid
JSON Schema degrades to `JsonValue` where it is wrong; rendering never raises on any JSON input.

Local `$ref`s (`#`, `#/$defs/X`, `#/definitions/X`, any JSON pointer) become named type aliases of
the tool they belong to, so recursive schemas render as recursive types.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final
from urllib.parse import unquote

from toolbus_registry.declarations.names import Scope, member_key, ts_string

JSON_VALUE: Final = "JsonValue"
NEVER: Final = "never"

# Precedence of a rendered type, to know where parentheses are needed.
UNION, INTERSECTION, ATOM = 0, 1, 2
Rendered = tuple[str, int]

MAX_DEPTH = 48
INLINE_WIDTH = 90

_OBJECT_KEYS = frozenset(
    {
        "properties",
        "additionalProperties",
        "patternProperties",
        "required",
        "minProperties",
        "maxProperties",
        "propertyNames",
        "dependentRequired",
        "dependentSchemas",
    }
)
_ARRAY_KEYS = frozenset(
    {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems", "contains"}
)
_STRING_KEYS = frozenset({"minLength", "maxLength", "pattern"})
_NUMBER_KEYS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
_TYPE_NAMES = ("string", "number", "integer", "boolean", "null", "array", "object")
# Keys that change which values a schema accepts (beside `$ref`, these make an intersection).
_CONSTRAINING = frozenset(
    {"type", "enum", "const", "allOf", "anyOf", "oneOf", "nullable"} | _OBJECT_KEYS | _ARRAY_KEYS
)


def literal(value: Any) -> str:
    """The TypeScript literal type of a JSON value."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return ts_string(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "number"
        return repr(value) if value == value else "number"
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + "; ".join(f"{member_key(str(k))}: {literal(v)}" for k, v in value.items()) + " }"
    return JSON_VALUE


def _json_type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_allows(types: Sequence[str] | None, value: Any) -> bool:
    if types is None:
        return True
    kind = _json_type_of(value)
    return kind in types or (kind == "integer" and "number" in types)


def schema_types(schema: Mapping[str, Any]) -> list[str] | None:
    """The JSON types a schema names (or implies by its keywords), None when it names none."""
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared] if declared in _TYPE_NAMES else None
    if isinstance(declared, list):
        names = [t for t in declared if isinstance(t, str) and t in _TYPE_NAMES]
        return list(dict.fromkeys(names)) or None
    implied: list[str] = []
    keys = schema.keys()
    if not _OBJECT_KEYS.isdisjoint(keys):
        implied.append("object")
    if not _ARRAY_KEYS.isdisjoint(keys):
        implied.append("array")
    if not _STRING_KEYS.isdisjoint(keys) or "format" in keys:
        implied.append("string")
    if not _NUMBER_KEYS.isdisjoint(keys):
        implied.append("number")
    return implied or None


def resolve_pointer(root: Any, ref: str) -> Any:
    """The part of `root` that local reference `ref` (`#`, `#/a/b`) points to, or None."""
    if not ref.startswith("#"):
        return None
    pointer = unquote(ref[1:])
    if pointer == "":
        return root
    if not pointer.startswith("/"):
        return None  # a plain-name anchor: not resolved
    node = root
    for raw in pointer[1:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict):
            if part not in node:
                return None
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def jsdoc(lines: Sequence[str], indent: str) -> str:
    """A JSDoc comment (ending in a newline and `indent`) for the given lines, or "" for none."""
    if not lines:
        return ""
    clean = [line.rstrip().replace("*/", "*\\/") for line in lines]
    while clean and not clean[-1].strip():
        clean.pop()
    while clean and not clean[0].strip():
        clean.pop(0)
    if not clean:
        return ""
    if len(clean) == 1:
        return f"/** {clean[0]} */\n{indent}"
    body = "".join(f"{indent} * {line}".rstrip() + "\n" for line in clean)
    return f"/**\n{body}{indent} */\n{indent}"


def schema_doc_lines(schema: Any, with_description: bool = True) -> list[str]:
    """The JSDoc lines that describe a property's schema: description, default, format, deprecated."""
    if not isinstance(schema, dict):
        return []
    lines: list[str] = []
    description = schema.get("description")
    if with_description and isinstance(description, str) and description.strip():
        lines.extend(description.strip().splitlines())
    elif with_description and isinstance(schema.get("title"), str) and schema["title"].strip():
        lines.extend(schema["title"].strip().splitlines())
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt:
        lines.append(f"@format {fmt}")
    if "default" in schema:
        with contextlib.suppress(TypeError, ValueError):
            lines.append("@default " + json.dumps(schema["default"], ensure_ascii=False))
    if schema.get("deprecated") is True:
        lines.append("@deprecated")
    return lines


_SCALAR_TS = {
    "string": "string",
    "number": "number",
    "integer": "number",
    "boolean": "boolean",
    "null": "null",
}
"""The TypeScript of each scalar JSON type."""
_SHAPING = frozenset(("$ref", "const", "enum", "anyOf", "oneOf", "allOf", "nullable"))
"""Keywords that change what a schema with a scalar `type` renders to; the rest only document it."""


def plain_scalar(schema: dict[str, Any]) -> str | None:
    """The scalar JSON type (`string`, `integer`, ...) a schema names with none of the keywords
    that shape it (`_SHAPING`), else None: what both renderers answer before their walk (most
    schema nodes are such, and the walk gives the same for them)."""
    declared = schema.get("type")
    if isinstance(declared, str) and declared in _SCALAR_TS and _SHAPING.isdisjoint(schema.keys()):
        return declared
    return None


_SPECIAL = frozenset((NEVER, JSON_VALUE))
"""Texts `union` and `intersection` treat apart (always atoms)."""


def _paren(item: Rendered, at_least: int) -> str:
    text, prec = item
    return text if prec >= at_least else f"({text})"


def union(items: Sequence[Rendered]) -> Rendered:
    """`A | B`, with duplicates dropped; `never` when empty, `JsonValue` when any part is."""
    if len(items) == 1 and items[0][0] not in _SPECIAL:
        return items[0]  # what the general case gives for one part (most schema nodes), cheaply
    texts = list(dict.fromkeys(_paren(i, INTERSECTION) for i in items if i[0] != NEVER))
    if not texts:
        return NEVER, ATOM
    if JSON_VALUE in texts:
        return JSON_VALUE, ATOM
    if len(texts) == 1:
        only = next(i for i in items if _paren(i, INTERSECTION) == texts[0])
        return only
    return " | ".join(texts), UNION


def intersection(items: Sequence[Rendered]) -> Rendered:
    """`A & B`, with duplicates and `JsonValue` parts dropped (they add no constraint)."""
    if len(items) == 1 and items[0][0] not in _SPECIAL:
        return items[0]
    kept = [i for i in items if i[0] != JSON_VALUE]
    if not kept:
        return JSON_VALUE, ATOM
    if any(i[0] == NEVER for i in kept):
        return NEVER, ATOM
    texts = list(dict.fromkeys(_paren(i, ATOM) for i in kept))
    if len(texts) == 1:
        return next(i for i in kept if _paren(i, ATOM) == texts[0])
    return " & ".join(texts), INTERSECTION


class Alias:
    """One named type of a tool: `export type <name> = <body>;`."""

    __slots__ = ("body", "doc", "name")

    def __init__(self, name: str, doc: list[str], body: str) -> None:
        self.name = name
        self.doc = doc
        self.body = body


class TypeRenderer:
    """Renders the schemas of one tool to TypeScript types.

    `qualify` turns an alias name into the way the rendered text refers to it (a tool keeps its
    aliases in its own namespace); `aliases` collects what `$ref`s needed, in first-use order.
    """

    def __init__(self, qualify: Callable[[str], str], alias_indent: str = "") -> None:
        self._qualify = qualify
        self._alias_indent = alias_indent
        self._scope = Scope()
        self._names: dict[tuple[int, str], str] = {}
        self._rendering: set[str] = set()
        self._roots: list[Any] = []
        self.aliases: list[Alias] = []

    def render_document(self, schema: Any, indent: str = "") -> str:
        """The type of a whole schema document (its `$ref`s resolve against it)."""
        self._roots.append(schema)
        return self._render(schema, len(self._roots) - 1, indent, 0, False)[0]

    # ---- the walk --------------------------------------------------------------------------

    def _render(self, schema: Any, doc: int, indent: str, depth: int, deferred: bool) -> Rendered:
        if schema is False:
            return NEVER, ATOM
        if not isinstance(schema, dict) or depth > MAX_DEPTH:
            return JSON_VALUE, ATOM
        scalar = plain_scalar(schema)
        if scalar is not None:
            return _SCALAR_TS[scalar], ATOM
        ref = schema.get("$ref")
        if isinstance(ref, str):
            target = self._ref(ref, doc, depth, deferred)
            if _CONSTRAINING.isdisjoint(schema.keys()):
                return target
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            return intersection([target, self._render(rest, doc, indent, depth + 1, deferred)])

        types = schema_types(schema)
        if "const" in schema:
            value = schema["const"]
            result: Rendered = (literal(value), ATOM) if _type_allows(types, value) else (NEVER, ATOM)
            return self._nullable(schema, result)
        enum = schema.get("enum")
        if isinstance(enum, list):
            values = [v for v in enum if _type_allows(types, v)]
            return self._nullable(schema, union([(literal(v), ATOM) for v in values]))

        parts: list[Rendered] = []
        any_of = schema.get("anyOf") if isinstance(schema.get("anyOf"), list) else None
        one_of = schema.get("oneOf") if isinstance(schema.get("oneOf"), list) else None
        distributed: str | None = None
        if types is not None:
            if types == ["object"] and (any_of is not None or one_of is not None):
                # Sibling properties + anyOf/oneOf: each branch is this object merged with it, so a
                # branch that only adds `required` still knows the types of its properties.
                distributed = "anyOf" if any_of is not None else "oneOf"
                branches = any_of if any_of is not None else one_of
                assert branches is not None
                merged = [self._merge_object_branch(schema, b, doc) for b in branches]
                parts.append(union([self._render(m, doc, indent, depth + 1, deferred) for m in merged]))
            else:
                parts.append(
                    union([self._render_type(t, schema, doc, indent, depth, deferred) for t in types])
                )
        all_of = schema.get("allOf")
        if isinstance(all_of, list):
            parts.extend(self._render(s, doc, indent, depth + 1, deferred) for s in all_of)
        for key, branches in (("anyOf", any_of), ("oneOf", one_of)):
            if branches is not None and key != distributed:
                parts.append(union([self._render(s, doc, indent, depth + 1, deferred) for s in branches]))
        if not parts:
            return self._nullable(schema, (JSON_VALUE, ATOM))
        return self._nullable(schema, intersection(parts))

    def _nullable(self, schema: Mapping[str, Any], rendered: Rendered) -> Rendered:
        if schema.get("nullable") is True:
            return union([rendered, ("null", ATOM)])
        return rendered

    def _render_type(
        self, kind: str, schema: Mapping[str, Any], doc: int, indent: str, depth: int, deferred: bool
    ) -> Rendered:
        if kind == "string":
            return "string", ATOM
        if kind in ("number", "integer"):
            return "number", ATOM
        if kind == "boolean":
            return "boolean", ATOM
        if kind == "null":
            return "null", ATOM
        if kind == "array":
            return self._array(schema, doc, indent, depth)
        return self._object(schema, doc, indent, depth)

    # ---- arrays ----------------------------------------------------------------------------

    def _array(self, schema: Mapping[str, Any], doc: int, indent: str, depth: int) -> Rendered:
        items = schema.get("items")
        prefix = schema.get("prefixItems")
        if isinstance(prefix, list):
            rest = items
        elif isinstance(items, list):
            prefix, rest = items, schema.get("additionalItems", True)
        else:
            element = self._render(items if items is not None else True, doc, indent, depth + 1, True)
            if element[0] == NEVER:
                return "[]", ATOM
            return _paren(element, ATOM) + "[]", ATOM
        min_items = schema.get("minItems")
        required = min_items if isinstance(min_items, int) and min_items > 0 else 0
        max_items = schema.get("maxItems")
        elements: list[str] = []
        for i, item in enumerate(prefix):
            if isinstance(max_items, int) and i >= max_items:
                break
            text = _paren(self._render(item, doc, indent, depth + 1, True), INTERSECTION)
            elements.append(text if i < required else f"{text}?")
        if not (isinstance(max_items, int) and max_items <= len(prefix)):
            rest_type = self._render(rest if rest is not None else True, doc, indent, depth + 1, True)
            if rest_type[0] != NEVER:
                elements.append(f"...{_paren(rest_type, ATOM)}[]")
        return "[" + ", ".join(elements) + "]", ATOM

    # ---- objects ---------------------------------------------------------------------------

    def _object(self, schema: Mapping[str, Any], doc: int, indent: str, depth: int) -> Rendered:
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        required_list = schema.get("required")
        required = (
            {r for r in required_list if isinstance(r, str)} if isinstance(required_list, list) else set()
        )
        inner = indent + "  "
        members: list[str] = []
        documented = False
        prop_types: list[Rendered] = []
        any_optional = False
        for key, sub in props.items():
            rendered = self._render(sub, doc, inner, depth + 1, True)
            prop_types.append(rendered)
            lines = schema_doc_lines(sub)
            comment = jsdoc(lines, inner)
            documented = documented or bool(comment)
            optional = key not in required
            any_optional = any_optional or optional
            members.append(f"{comment}{member_key(key)}{'?' if optional else ''}: {rendered[0]};")

        additional = schema.get("additionalProperties", True)
        patterns = schema.get("patternProperties")
        patterns = patterns if isinstance(patterns, dict) else {}
        index_types: list[Rendered] = []
        if additional is not False:
            if isinstance(additional, dict):
                index_types.append(self._render(additional, doc, inner, depth + 1, True))
            else:
                index_types.append((JSON_VALUE, ATOM))
        for sub in patterns.values():
            index_types.append(self._render(sub, doc, inner, depth + 1, True))
        index = union(index_types) if index_types else None

        for key in sorted(required - props.keys()):
            value = index if index is not None and index[0] != NEVER else (JSON_VALUE, ATOM)
            if additional is False and not patterns:
                value = (NEVER, ATOM)  # required but not allowed: nothing validates
            members.append(f"{member_key(key)}: {value[0]};")
            prop_types.append(value)

        if index is not None and index[0] != NEVER:
            # TypeScript wants every named property to fit the index signature.
            index = union([index, *prop_types])
            text = index[0] + (" | undefined" if any_optional else "")
            members.append(f"[key: string]: {text};")
        if not members:
            # `{}` would accept any non-null value; a closed object with nothing in it takes no key.
            return ("{ [key: string]: never }" if additional is False and not patterns else "{}"), ATOM
        if not documented:
            flat = "{ " + " ".join(members)[:-1] + " }"
            if len(flat) <= INLINE_WIDTH and "\n" not in flat:
                return flat, ATOM
        body = "".join(f"{inner}{m}\n" for m in members)
        return "{\n" + body + indent + "}", ATOM

    def _merge_object_branch(self, parent: Mapping[str, Any], branch: Any, doc: int) -> Any:
        """The schema of `parent` (an object with anyOf/oneOf) restricted to one branch."""
        seen: set[str] = set()
        while isinstance(branch, dict) and isinstance(branch.get("$ref"), str) and len(branch) == 1:
            ref = branch["$ref"]
            if ref in seen or len(seen) > 8:
                break
            seen.add(ref)
            target = resolve_pointer(self._roots[doc], ref)
            if not isinstance(target, dict):
                break
            branch = target
        if branch is True:
            branch = {}
        if not isinstance(branch, dict):
            return branch
        branch_types = schema_types(branch)
        if "$ref" in branch or (branch_types is not None and branch_types != ["object"]):
            base = {k: v for k, v in parent.items() if k not in ("anyOf", "oneOf", "allOf")}
            return {"allOf": [base, branch]}
        p_props: dict[str, Any] = parent.get("properties") or {}
        b_props: dict[str, Any] = branch.get("properties") or {}
        if not isinstance(p_props, dict):
            p_props = {}
        if not isinstance(b_props, dict):
            b_props = {}
        p_closed = parent.get("additionalProperties") is False and not parent.get("patternProperties")
        b_closed = branch.get("additionalProperties") is False and not branch.get("patternProperties")
        props: dict[str, Any] = {}
        for key in dict.fromkeys([*p_props, *b_props]):
            if (p_closed and key not in p_props) or (b_closed and key not in b_props):
                continue
            if key in p_props and key in b_props:
                props[key] = {"allOf": [p_props[key], b_props[key]]}
            else:
                props[key] = p_props[key] if key in p_props else b_props[key]
        required: list[str] = []
        for source in (parent.get("required"), branch.get("required")):
            if isinstance(source, list):
                required.extend(r for r in source if isinstance(r, str) and r not in required)
        merged: dict[str, Any] = {k: v for k, v in branch.items() if k not in ("type", "$ref")}
        merged["type"] = "object"
        merged["properties"] = props
        merged["required"] = required
        if p_closed or b_closed:
            merged["additionalProperties"] = False
            merged.pop("patternProperties", None)
        elif "additionalProperties" in parent and "additionalProperties" not in branch:
            merged["additionalProperties"] = parent["additionalProperties"]
        if "patternProperties" in parent and "patternProperties" not in merged and not (p_closed or b_closed):
            merged["patternProperties"] = parent["patternProperties"]
        return merged

    # ---- references ------------------------------------------------------------------------

    def _ref(self, ref: str, doc: int, depth: int, deferred: bool) -> Rendered:
        key = (doc, ref)
        name = self._names.get(key)
        if name is not None:
            if name in self._rendering and not deferred:
                return JSON_VALUE, ATOM  # a type alias may not be itself without an object between
            return self._qualify(name), ATOM
        target = resolve_pointer(self._roots[doc], ref)
        if target is None:
            return JSON_VALUE, ATOM
        name = self._scope.claim(_alias_name(ref), "Root")
        self._names[key] = name
        self._rendering.add(name)
        body = self._render(target, doc, self._alias_indent, depth + 1, False)[0]
        self._rendering.discard(name)
        self.aliases.append(Alias(name, schema_doc_lines(target), body))
        return self._qualify(name), ATOM


_WORD = re.compile(r"[A-Za-z0-9]+")


def _alias_name(ref: str) -> str:
    segment = ref.rstrip("/").rsplit("/", 1)[-1] if ref not in ("#", "#/") else "Root"
    segment = unquote(segment).replace("~1", "/").replace("~0", "~")
    words = _WORD.findall(segment)
    if not words:
        return "Root" if segment in ("", "#") else "T"
    return "".join(w[:1].upper() + w[1:] for w in words)
