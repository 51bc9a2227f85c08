"""How a toolset's namespace catalogue (`toolsets.namespaces`) reads to a model: the guide and the
bounded lines a `search_tools` description carries, shared by the SDK's agent tools and the
gateway's large-toolset mode."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from toolbus_contracts.registry import NAMESPACES_MAX, NamespaceInfo

SEARCH_GUIDE = (
    "Search the tools available to you. Write the query in the API's own terms: the resource and "
    "the action (e.g. 'create message', 'list call recordings', 'request reviewers pull request'), "
    "not the user's words. Pass `namespaces` with the one or few namespaces below that fit the "
    "task. If the hits don't fit, search again with other words or other namespaces, or read a "
    "namespace's whole list with list_tools. Returns the best matching tools, best first, each "
    "with its qualified name, its namespace and its declaration; call one with call_tool."
)
SEARCH_INPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {
            "type": "string",
            "minLength": 1,
            "description": "The resource and the action, in the API's terms, in a few words.",
        },
        "namespaces": {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "maxItems": NAMESPACES_MAX,
            "description": "Search only these namespaces (from the list in this tool's description).",
        },
        "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 5},
    },
    "required": ["query"],
    "additionalProperties": False,
}
"""`search_tools`' input: the query, the namespaces to search (names of the catalogue), a limit."""
CATALOGUE_CHARS = 6000
"""Most characters of namespace catalogue a `search_tools` description carries (~1,500 tokens)."""


def catalogue_text(namespaces: Sequence[NamespaceInfo], max_chars: int = CATALOGUE_CHARS) -> str:
    """The namespaces as lines for a model (`- name (kind, N tools): summary`), at most
    `max_chars`: past that, the rest are named without summaries, then only counted."""
    head = "Namespaces:"
    lines = [head]
    used = len(head)
    rest = list(namespaces)
    while rest:
        n = rest[0]
        line = f"- {n.name} ({n.kind}, {n.tool_count} tools): {n.summary}"
        if used + 1 + len(line) > max_chars * 3 // 4:
            break
        lines.append(line)
        used += 1 + len(line)
        rest.pop(0)
    if rest:
        names: list[str] = []
        for n in list(rest):
            tail = f"\n(and {len(rest)} more namespaces: search without `namespaces` to reach them)"
            item = f"{n.name} ({n.tool_count})"
            if used + len(", ".join([*names, item])) + 8 + len(tail) > max_chars:
                break
            names.append(item)
            rest.pop(0)
        if names:
            lines.append("Also: " + ", ".join(names))
        if rest:
            lines.append(f"(and {len(rest)} more namespaces: search without `namespaces` to reach them)")
    return "\n".join(lines)


def search_description(namespaces: Sequence[NamespaceInfo], max_chars: int = CATALOGUE_CHARS) -> str:
    """`search_tools`' description: the guide, then the catalogue (the guide alone without one)."""
    return f"{SEARCH_GUIDE}\n\n{catalogue_text(namespaces, max_chars)}" if namespaces else SEARCH_GUIDE
