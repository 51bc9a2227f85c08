"""The namespace catalogue of a toolset: each namespace (MCP server, host group, `http`,
`workflows`) with its kind, tool count and a one-line summary, for a model to choose where to
search. The summary is the MCP server's own (pinned with its tools), else the user's
`description` of it, else made from the namespace's tools' names (their main actions and
resources)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from toolbus_contracts import NamespaceInfo, PinnedToolset
from toolbus_contracts.registry import HTTP_FETCH_DESCRIPTION, NamespaceKind, SummarySource

from toolbus_registry.declarations.prompt import first_sentence
from toolbus_registry.search.index import scope_name
from toolbus_registry.search.text import resource_words, tool_action

SUMMARY_CHARS = 160
"""Longest summary line (a sentence is cut at a word before it)."""
RESOURCES_SHOWN = 6
"""Resources a derived summary names, most common first."""
_ACTION_ORDER = ("list", "fetch", "create", "update", "delete")
_ACTION_WORDS = {"list": "list", "fetch": "get", "create": "create", "update": "update", "delete": "delete"}


def _line(text: str) -> str:
    """`text`'s first sentence on one line, at most `SUMMARY_CHARS`."""
    line = first_sentence(text)
    if len(line) > SUMMARY_CHARS:
        line = line[: SUMMARY_CHARS - 1].rsplit(" ", 1)[0] + "…"
    return line


def _singular(word: str) -> str:
    keep = word.endswith(("ss", "us", "is"))
    return word[:-1] if len(word) > 3 and word.endswith("s") and not keep else word


def derived_summary(local_names: Iterable[str]) -> str:
    """A line made from tool names: the actions they take and the resources they act on, most
    common first (`list, get, create, update: message, call, recording, queue (+12 more)`)."""
    actions: Counter[str] = Counter()
    resources: Counter[str] = Counter()
    for name in local_names:
        action = tool_action(name)
        if action is not None:
            actions[action] += 1
        words = [w.lower() for w in resource_words(name) if len(w) > 1 and not w.isdigit()]
        if words:
            resources[
                _singular(words[0]) if len(words) == 1 else " ".join([*words[:-1], _singular(words[-1])])
            ] += 1
    verbs = [_ACTION_WORDS[a] for a in _ACTION_ORDER if actions[a]]
    ranked = [r for r, _ in sorted(resources.items(), key=lambda kv: (-kv[1], kv[0]))]
    shown = ranked[:RESOURCES_SHOWN]
    more = f" (+{len(ranked) - len(shown)} more)" if len(ranked) > len(shown) else ""
    things = ", ".join(shown) + more
    line = f"{', '.join(verbs)}: {things}" if verbs and things else things or ", ".join(verbs)
    return line if len(line) <= SUMMARY_CHARS else line[: SUMMARY_CHARS - 1].rsplit(",", 1)[0] + "…"


def _summary(
    server: str | None, user: str | None, local_names: Sequence[str], single: str | None = None
) -> tuple[str, SummarySource]:
    given: tuple[tuple[str | None, SummarySource], ...] = ((server, "server"), (user, "user"))
    for text, source in given:
        line = _line(text or "")
        if line:
            return line, source
    if single is not None and (line := _line(single)):
        return line, "derived"
    return derived_summary(local_names) or "tools", "derived"


def catalogue(pinned: PinnedToolset) -> list[NamespaceInfo]:
    """Every namespace of a pinned toolset, sorted by name (a host tool with no group is a
    namespace of its own, named as the tool; it joins a server of the same name)."""
    entries: dict[str, tuple[NamespaceKind, list[str], str | None, str | None, str | None]] = {}
    for server in pinned.servers:
        entries[server.name] = ("mcp", [t.name for t in server.tools], server.about, server.description, None)
    for tool in pinned.host:
        namespace = scope_name(tool.name)
        kind, names, about, user, _ = entries.get(namespace, ("host", [], None, None, None))
        local = tool.name.partition(".")[2] or tool.name
        single = tool.description if namespace == tool.name and not names else None
        entries[namespace] = (kind, [*names, local], about, user, single)
    if pinned.http is not None:
        entries["http"] = ("http", ["fetch"], None, None, HTTP_FETCH_DESCRIPTION)
    if pinned.workflows:
        names = [w.name for w in pinned.workflows]
        single = pinned.workflows[0].description if len(names) == 1 else None
        entries["workflows"] = ("workflows", names, None, None, single)
    out = []
    for name in sorted(entries):
        kind, names, about, user, single = entries[name]
        summary, source = _summary(about, user, names, single if len(names) == 1 else None)
        out.append(
            NamespaceInfo(name=name, kind=kind, tool_count=len(names), summary=summary, summary_source=source)
        )
    return out
