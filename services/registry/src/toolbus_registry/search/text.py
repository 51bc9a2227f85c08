"""Turning tool names, descriptions and queries into search terms.

`split_identifier` breaks `list_issues`, `listIssues`, `API-get-user`, `github.list_issues` and
`HTTPServer2` into words; `terms` lowercases, drops stop words and stems (Porter), so that
"creating issues" and `create_issue` meet on the same terms; `expand` adds the synonyms of a
query's terms (a small map of the verbs and nouns that tools are named with) at a lower weight.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from itertools import chain

from toolbus_registry.search.stemmer import stem

# camelCase and acronym boundaries: "getHTTPResponse2x" -> get HTTP Response 2x.
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")

_STOP_WORDS_TEXT = """
a an the to of for in on at by with from into onto and or but nor is are was were be been
being it its this that these those there here i me my mine we our us you your he she they
them their his her some any please can could would should will shall may might must do does
did so as if then than via about using use which what who whom whose how when where why want
need like just also up out over under again very let lets
"""
STOP_WORDS = frozenset(_STOP_WORDS_TEXT.split())


def split_identifier(text: str) -> list[str]:
    """Words of an identifier or free text, split on non-alphanumerics, snake/kebab/dot separators
    and camelCase boundaries, lowercased. `"API-get-user" -> ["api", "get", "user"]`."""
    # One pass over the whole text: the pattern matches only letters and digits, so splitting
    # into alphanumeric chunks first finds the same words (that was 4x slower on 1,000 tools).
    if len(text) <= _CACHED_CHARS:
        return list(_identifier_words(text))
    return " ".join(_CAMEL.findall(text)).lower().split()


_CACHED_CHARS = 64


@lru_cache(maxsize=8192)
def _identifier_words(text: str) -> tuple[str, ...]:
    """`split_identifier` of a short text (a tool or namespace name), remembered: building an
    index splits each tool's name four times (its terms, both embedding texts, its verb)."""
    return tuple(part.lower() for part in _CAMEL.findall(text))


_ALNUM = re.compile(r"[A-Za-z0-9]+")
_CHUNK_TERMS: dict[str, tuple[str, ...]] = {}
"""An alphanumeric run of text (`"HTTPServer2"`, `"issues"`, `"The"`) -> its terms. `_CAMEL`
matches within such runs only, so the terms of a text are those of its runs in order: looked up
with `map` (no Python frame a word), the runs never seen computed once. Only runs of at most
`_CHUNK_CHARS` characters are kept, and the memo is emptied at `_CHUNKS_MAX` (a corpus's whole
vocabulary is a few thousand runs; 50,000 short ones are ~10 MiB with their stems)."""
_CHUNK_CHARS = 32
_CHUNKS_MAX = 50_000


def _chunk_terms(chunk: str) -> tuple[str, ...]:
    if chunk.isalpha() and (chunk.islower() or chunk.istitle()):  # one word: most runs of text
        word = chunk.lower()
        return () if word in STOP_WORDS else (stem(word),)
    words = (part.lower() for part in _CAMEL.findall(chunk))
    return tuple(stem(w) for w in words if w not in STOP_WORDS)


def terms(text: str) -> list[str]:
    """Stemmed search terms of a text or identifier, stop words removed, in order (the words of
    `split_identifier`, each stemmed unless a stop word)."""
    chunks = _ALNUM.findall(text)
    found = list(map(_CHUNK_TERMS.get, chunks))
    if None in found:
        # Computed here, and taken from here: another thread may empty the memo meanwhile.
        missing = {c for hit, c in zip(found, chunks, strict=True) if hit is None}
        fresh = {chunk: _chunk_terms(chunk) for chunk in missing}
        if len(_CHUNK_TERMS) >= _CHUNKS_MAX:
            _CHUNK_TERMS.clear()
        _CHUNK_TERMS.update((c, t) for c, t in fresh.items() if len(c) <= _CHUNK_CHARS)
        found = [hit if hit is not None else fresh[c] for hit, c in zip(found, chunks, strict=True)]
    return list(chain.from_iterable(found))  # type: ignore[arg-type]  # no None left


# Groups of words that mean the same thing to someone looking for a tool. Each word of a query
# also searches for the other words of its groups (stemmed), with a lower weight.
SYNONYM_GROUPS: tuple[tuple[str, ...], ...] = (
    ("delete", "remove", "erase", "destroy", "drop", "trash", "discard", "forget"),
    ("create", "make", "new", "add", "insert", "post", "open", "record"),
    ("get", "fetch", "retrieve", "read", "show", "view", "obtain", "lookup", "load", "see", "inspect"),
    ("list", "enumerate", "all", "browse"),
    ("search", "find", "query", "lookup", "locate", "look"),
    ("update", "edit", "modify", "change", "patch", "alter", "set", "rename"),
    ("write", "save", "store", "overwrite", "put"),
    ("move", "rename", "relocate", "mv"),
    ("directory", "folder", "dir"),
    ("file", "document"),
    ("repository", "repo", "project"),
    ("pull", "pr", "merge"),
    ("issue", "bug", "ticket"),
    ("comment", "reply", "remark", "note"),
    ("user", "person", "people", "account", "member", "profile"),
    ("screenshot", "capture", "screen", "picture", "image"),
    ("navigate", "go", "goto", "visit", "open", "url", "load"),
    ("click", "press", "tap"),
    ("type", "enter", "fill", "input"),
    ("key", "keyboard", "keystroke"),
    ("close", "shut", "quit", "exit"),
    ("tab", "tabs"),
    ("console", "log", "logs"),
    ("wait", "pause", "sleep", "delay"),
    ("entity", "node"),
    ("observation", "fact", "note"),
    ("relation", "relationship", "link", "edge"),
    ("graph", "memory", "knowledge", "remember"),
    ("database", "db", "table"),
    ("block", "content", "paragraph"),
    ("size", "sizes", "big", "large"),
    ("info", "information", "metadata", "details", "stat", "stats"),
    ("compress", "zip", "gzip"),
    ("sum", "add", "total", "plus"),
    ("echo", "repeat"),
    ("environment", "env", "variables"),
    ("commit", "commits", "history"),
    ("branch", "branches"),
    ("fork", "copy", "clone"),
    ("review", "approve"),
    ("diff", "changed", "changes"),
    ("status", "checks", "ci"),
    ("request", "requests", "traffic", "network"),
    ("javascript", "js", "script", "evaluate", "eval"),
    ("upload", "attach"),
    ("dialog", "alert", "popup", "prompt"),
    ("hover", "mouseover"),
    ("drag", "drop"),
    ("resize", "dimensions", "viewport"),
    ("markdown", "md"),
    ("tree", "recursive", "hierarchy"),
    # Words of the domains tools come from (source hosting, CI, communication APIs, accounts):
    # the abbreviation a person types and the word an API names its operation with.
    ("organization", "org", "organisation", "company", "team"),
    ("teammate", "colleague", "member", "collaborator", "coworker"),
    ("reviewer", "review", "look"),
    ("request", "ask", "invite"),
    ("workflow", "action", "actions", "pipeline", "ci", "build", "job"),
    ("run", "execution", "trigger", "dispatch"),
    ("release", "tag", "version"),
    ("limit", "quota", "remaining", "left", "allowance"),
    ("message", "sms", "text", "mms", "whatsapp"),
    ("call", "phone", "dial", "ring", "voice"),
    ("verification", "verify", "otp", "passcode", "2fa", "code"),
    ("meeting", "conference", "room"),
    ("credential", "key", "token", "secret", "password"),
    ("usage", "spend", "spent", "cost", "bill", "billing", "balance"),
    ("price", "pricing", "cost", "rate"),
    ("terminate", "end", "hang", "stop", "cancel"),
    ("webhook", "callback", "notify", "notification", "hook"),
    ("agent", "worker"),
    ("subaccount", "account"),
    ("secret", "secrets", "vault"),
    ("star", "starred", "favorite", "bookmark"),
    ("notification", "notifications", "inbox", "alert"),
)


def _build_synonyms(groups: Iterable[tuple[str, ...]]) -> dict[str, frozenset[str]]:
    table: dict[str, set[str]] = {}
    for group in groups:
        stems = {stem(w) for w in group}
        for s in stems:
            table.setdefault(s, set()).update(stems - {s})
    return {k: frozenset(v) for k, v in table.items()}


SYNONYMS: dict[str, frozenset[str]] = _build_synonyms(SYNONYM_GROUPS)


def expand(query_terms: Iterable[str], synonym_weight: float) -> list[dict[str, float]]:
    """What a query searches for: one group per distinct query term, holding the term at 1.0 (more
    if repeated) and its synonyms at `synonym_weight`."""
    counts: dict[str, int] = {}
    for t in query_terms:
        counts[t] = counts.get(t, 0) + 1
    groups: list[dict[str, float]] = []
    for t, n in counts.items():
        group = {t: float(n)}
        for syn in sorted(SYNONYMS.get(t, ())):
            if syn not in counts:
                group[syn] = synonym_weight
        groups.append(group)
    return groups


# What a tool does to its resource, read off the verb its name starts with (REST operations turned
# into tools are named so: `CreateMessage`, `list_issues`, `API-patch-page`), and what a request
# asks to do, read off its first verb. A tool whose verb is the one asked for gets a bonus in the
# re-ranked head: "cancel a pending verification" is an update of the verification, not a create.
ACTIONS = ("create", "list", "fetch", "update", "delete")
_TOOL_VERBS: dict[str, str] = {
    **dict.fromkeys(("create", "add", "post", "insert", "new"), "create"),
    **dict.fromkeys(("list", "search", "query"), "list"),
    **dict.fromkeys(("get", "fetch", "read", "retrieve", "describe"), "fetch"),
    **dict.fromkeys(("update", "edit", "modify", "patch", "set"), "update"),
    **dict.fromkeys(("delete", "remove", "destroy"), "delete"),
}
_REQUEST_VERBS: dict[str, str] = {
    **dict.fromkeys(
        (
            "create", "add", "new", "make", "send", "start", "register", "buy", "purchase",
            "provision", "upload", "append", "publish", "invite", "build", "install", "subscribe",
            "schedule", "generate", "post", "file", "leave", "remember",
        ),
        "create",
    ),
    **dict.fromkeys(("list", "every", "all", "which", "many", "browse", "history"), "list"),
    **dict.fromkeys(("get", "fetch", "look", "check", "details", "read", "inspect"), "fetch"),
    **dict.fromkeys(
        (
            "update", "change", "edit", "modify", "rename", "cancel", "end", "stop", "pause",
            "resume", "mute", "unmute", "suspend", "approve", "accept", "reject", "mark", "redirect",
            "hang", "point", "turn", "enable", "disable", "close", "reopen", "assign", "archive",
        ),
        "update",
    ),
    **dict.fromkeys(("delete", "remove", "erase", "release", "drop", "revoke", "purge", "destroy", "forget"), "delete"),
}  # fmt: skip
_LIST_WORDS = frozenset(("every", "all", "which", "many", "list"))


def tool_action(local_name: str) -> str | None:
    """The action a tool's name starts with (its first word that is a CRUD verb), or None."""
    for word in split_identifier(local_name)[:3]:
        action = _TOOL_VERBS.get(word)
        if action is not None:
            return action
    return None


def resource_words(local_name: str) -> list[str]:
    """The words of a tool's name without its leading CRUD verb: what it acts on
    (`CreateMessageFeedback` -> message feedback)."""
    words = split_identifier(local_name)
    return words[1:] if words and words[0] in _TOOL_VERBS else words


def request_action(query: str) -> str | None:
    """The action a request asks for: "list" if it asks for every/all/which/how many, else the
    action of its first verb that names one, else None."""
    words = split_identifier(query)
    if _LIST_WORDS.intersection(words):
        return "list"
    for word in words:
        action = _REQUEST_VERBS.get(word)
        if action is not None:
            return action
    return None
