"""The `prompt` declarations of a toolset: one short line per tool, for a model's context.

A line reads `github.list_issues(owner: string, state?: "open"|"closed") -> {content: ContentBlock[]}
-- List issues in a repository.`: the qualified name, the parameters with compact types (`?` marks
an optional one), the result type and the description's first sentence. Nested types are cut to a
fixed depth and length so that a hundred tools fit in a few thousand tokens.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from toolbus_contracts import ToolInfo

from toolbus_registry.declarations.names import member_key
from toolbus_registry.declarations.schema_to_ts import literal, plain_scalar, resolve_pointer, schema_types

MAX_ENUM = 6
MAX_PROPS = 6
MAX_PARAM_TYPE = 70
MAX_SENTENCE = 160
MAX_DEPTH = 2
MCP_RESULT = "{content: ContentBlock[]}"

_SENTENCE_END = re.compile(r"(?<=[.!?])\s")
_SPACE = re.compile(r"\s+")


def first_sentence(description: str | None) -> str:
    """The description's first sentence on one line, cut at a word near 160 characters."""
    text = _SPACE.sub(" ", (description or "").strip())
    if not text:
        return ""
    text = _SENTENCE_END.split(text, maxsplit=1)[0]
    if len(text) > MAX_SENTENCE:
        cut = text[:MAX_SENTENCE].rsplit(" ", 1)[0]
        text = cut + "…"
    return text


class _Compact:
    """Compact, lossy type text for one schema document."""

    def __init__(self, root: Any) -> None:
        self._root = root
        self._resolving: set[str] = set()

    def render(self, schema: Any, depth: int) -> str:
        if schema is False:
            return "never"
        if not isinstance(schema, dict) or depth > 6:
            return "json"
        scalar = plain_scalar(schema)
        if scalar is not None:
            return scalar
        ref = schema.get("$ref")
        if isinstance(ref, str):
            name = ref.rstrip("/").rsplit("/", 1)[-1] or "json"
            if ref in self._resolving:
                return name if name != "#" else "object"
            target = resolve_pointer(self._root, ref)
            if target is None:
                return "json"
            self._resolving.add(ref)
            try:
                return self.render(target, depth)
            finally:
                self._resolving.discard(ref)
        if "const" in schema:
            return literal(schema["const"])
        enum = schema.get("enum")
        if isinstance(enum, list):
            shown = [literal(v) for v in enum[:MAX_ENUM]]
            return "|".join(shown + (["…"] if len(enum) > MAX_ENUM else [])) or "never"
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list) and branches and schema_types(schema) is None:
                return self._join([self.render(b, depth) for b in branches], "|")
        all_of = schema.get("allOf")
        if isinstance(all_of, list) and all_of and schema_types(schema) is None:
            return self._join([self.render(b, depth) for b in all_of], "&")
        types = schema_types(schema)
        if types is None:
            return "json"
        texts = [self._type(t, schema, depth) for t in types]
        if schema.get("nullable") is True:
            texts.append("null")
        return self._join(texts, "|")

    @staticmethod
    def _join(texts: list[str], sep: str) -> str:
        unique = list(dict.fromkeys(texts))
        return sep.join(unique) if "json" not in unique or sep == "&" else "json"

    def _type(self, kind: str, schema: dict[str, Any], depth: int) -> str:
        if kind == "array":
            prefix = schema.get("prefixItems")
            if not isinstance(prefix, list) and isinstance(schema.get("items"), list):
                prefix = schema["items"]
            if isinstance(prefix, list):
                return "[" + ", ".join(self.render(s, depth + 1) for s in prefix) + "]"
            element = self.render(schema.get("items", True), depth + 1)
            return (f"({element})" if "|" in element or "&" in element else element) + "[]"
        if kind == "object":
            props = schema.get("properties")
            if not isinstance(props, dict) or not props or depth >= MAX_DEPTH:
                return "object"
            return "{" + self.params(schema, depth + 1) + "}"
        return kind

    def params(self, schema: dict[str, Any], depth: int) -> str:
        props = schema.get("properties")
        if not isinstance(props, dict):
            return ""
        required_list = schema.get("required")
        required = set(required_list) if isinstance(required_list, list) else set()
        parts: list[str] = []
        for i, (key, sub) in enumerate(props.items()):
            if depth > 0 and i >= MAX_PROPS:
                parts.append("…")
                break
            text = self.render(sub, depth)
            if len(text) > MAX_PARAM_TYPE:
                text = self.render(sub, MAX_DEPTH + 1) if depth < MAX_DEPTH else "…"
                if len(text) > MAX_PARAM_TYPE:
                    text = text[:MAX_PARAM_TYPE] + "…"
            mark = "" if key in required else "?"
            parts.append(f"{member_key(key)}{mark}: {text}")
        return ", ".join(parts)


def tool_prompt_line(tool: ToolInfo) -> str:
    """One line for one tool: qualified name, parameters, result type, first sentence."""
    schema = tool.input_schema
    compact = _Compact(schema)
    if isinstance(schema, dict) and isinstance(schema.get("properties"), dict) and "$ref" not in schema:
        params = compact.params(schema, 0)
    else:
        params = f"input: {compact.render(schema, 0)}"
    if tool.output_schema is not None:
        result = _Compact(tool.output_schema).render(tool.output_schema, 1)
    elif tool.kind == "mcp":
        result = MCP_RESULT
    else:
        result = "json"
    line = f"{tool.name}({params}) -> {result}"
    sentence = first_sentence(tool.description)
    return f"{line} -- {sentence}" if sentence else line


def render_prompt(tools: Sequence[ToolInfo]) -> str:
    """The prompt declarations of a toolset: its tools' lines sorted by qualified name."""
    return "".join(tool_prompt_line(t) + "\n" for t in sorted(tools, key=lambda t: t.name))
