"""How a toolset's namespace catalogue (`toolsets.namespaces`) reads to a model: the guide and the
bounded lines a `search_tools` description carries, shared by the SDK's agent tools and the
gateway's large-toolset mode."""

from __future__ import annotations

import re
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
CATALOGUE_CHARS = 8000
"""Most characters of namespace catalogue a `search_tools` description carries (~2,000 tokens):
room for every namespace's name in toolsets of several hundred namespaces (`catalogue_text`)."""
SUMMARY_CUTS = (160, 100, 64, 40)
"""Lengths a summary is cut to, longest first, when the whole catalogue does not fit."""
_SEPARATOR = re.compile(r"[_.-]")
_HEAD = "Namespaces:"
READ_MORE = "list_tools without a namespace reads every namespace's summary; with one, its tools."
"""How the model reads what the catalogue leaves out, with `AgentTools`' own `list_tools`."""
_NAMED_ONLY = "Also, named only (tools): "
_NAMES = "Also, named only: "
_GROUPS = "(Names sharing a first word are written prefix{a, b}: prefixa and prefixb.)"


def catalogue_text(
    namespaces: Sequence[NamespaceInfo], max_chars: int = CATALOGUE_CHARS, *, read_more: str = READ_MORE
) -> str:
    """The namespaces for a model, one line each (`- name (kind, N tools): summary`), in at most
    `max_chars`, every namespace named while their names fit: when the whole list is too long,
    summaries are cut short (with an ellipsis); then the namespaces with most tools keep a line
    and the others are named only (tool counts, grouped by first word); past even that, the rest
    are counted. What is left out is said, with `read_more`: how to read it (another front end
    than `AgentTools`, the gateway's, names its own tools there)."""
    full = "\n".join([_HEAD, *(namespace_line(n, None) for n in namespaces)])
    if len(full) <= max_chars:
        return full
    for chars in SUMMARY_CUTS:
        text = "\n".join(
            [_HEAD, *(namespace_line(n, chars) for n in namespaces), f"(Summaries cut short: {read_more})"]
        )
        if len(text) <= max_chars:
            return text
    by_size = sorted(range(len(namespaces)), key=lambda i: -namespaces[i].tool_count)
    text, _ = _lines_and_names(namespaces, set(), max_chars, read_more)
    low, high = 0, len(by_size)
    while low < high:  # the most lines that fit beside every other namespace's name
        mid = (low + high + 1) // 2
        attempt, whole = _lines_and_names(namespaces, set(by_size[:mid]), max_chars, read_more)
        if whole:
            low, text = mid, attempt
        else:
            high = mid - 1
    return text


def _cut(summary: str, chars: int) -> str:
    """`summary` in at most `chars` characters, cut at a word, with an ellipsis."""
    if len(summary) <= chars:
        return summary
    cut = summary[: chars - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > chars // 2 else cut).rstrip(" ,;:") + "\u2026"


def namespace_line(n: NamespaceInfo, chars: int | None = None) -> str:
    """One namespace as a catalogue line, its summary cut to `chars` (whole when None)."""
    summary = n.summary if chars is None else _cut(n.summary, chars)
    return f"- {n.name} ({n.kind}, {n.tool_count} tools): {summary}"


def _named(namespaces: Sequence[NamespaceInfo], counts: bool = True) -> str:
    """Names (with tool counts), comma-separated; those sharing a first word grouped as
    `prefix{a (3), b (5)}` (meaning `prefixa` and `prefixb`), in first-seen order."""
    groups: dict[str, list[NamespaceInfo]] = {}
    for n in namespaces:
        m = _SEPARATOR.search(n.name)
        groups.setdefault(n.name[: m.end()] if m and m.end() < len(n.name) else n.name, []).append(n)

    def one(n: NamespaceInfo, skip: int) -> str:
        return f"{n.name[skip:]} ({n.tool_count})" if counts else n.name[skip:]

    return ", ".join(
        one(ms[0], 0) if len(ms) == 1 else prefix + "{" + ", ".join(one(n, len(prefix)) for n in ms) + "}"
        for prefix, ms in groups.items()
    )


def _lines_and_names(
    namespaces: Sequence[NamespaceInfo], lined: set[int], max_chars: int, read_more: str
) -> tuple[str, bool]:
    """Lines (summaries cut to the shortest of `SUMMARY_CUTS`) for the namespaces at `lined`, the
    others named only, as many as fit (the rest counted); and whether all of them fit."""
    lines = [_HEAD, *(namespace_line(n, SUMMARY_CUTS[-1]) for i, n in enumerate(namespaces) if i in lined)]
    rest = [n for i, n in enumerate(namespaces) if i not in lined]
    how_to_read = f"{_GROUPS[:-1]} {read_more})"
    if not rest:
        text = "\n".join([*lines, f"(Summaries cut short: {read_more})"])
        return text, len(text) <= max_chars
    for head, counts in ((_NAMED_ONLY, True), (_NAMES, False)):
        text = "\n".join([*lines, head + _named(rest, counts), how_to_read])
        if len(text) <= max_chars:
            return text, True
    low, high = 0, len(rest)  # the most names that fit, the rest counted
    shown = "\n".join([*lines, f"(and {len(rest)} more namespaces)", how_to_read])
    while low < high:
        mid = (low + high + 1) // 2
        more = f"(and {len(rest) - mid} more namespaces)"
        attempt = "\n".join([*lines, _NAMES + _named(rest[:mid], False), more, how_to_read])
        if len(attempt) <= max_chars:
            low, shown = mid, attempt
        else:
            high = mid - 1
    return shown, False


def search_description(
    namespaces: Sequence[NamespaceInfo], max_chars: int = CATALOGUE_CHARS, *, read_more: str = READ_MORE
) -> str:
    """`search_tools`' description: the guide, then the catalogue (the guide alone without one)."""
    if not namespaces:
        return SEARCH_GUIDE
    return f"{SEARCH_GUIDE}\n\n{catalogue_text(namespaces, max_chars, read_more=read_more)}"
