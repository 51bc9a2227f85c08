"""Names in generated TypeScript: where a tool lives, how a key is written, and identifiers that
never collide and are never reserved words."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable

from toolbus_contracts import ToolInfo

_PLAIN_IDENT = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]*$")
_NOT_IDENT_CHAR = re.compile(r"[^A-Za-z0-9_$]")

# Words that may not name a type, namespace or function, and keys that read as syntax inside a
# type literal (`new(...)` is a construct signature there, not a method named "new").
RESERVED = frozenset(
    [
        "break",
        "case",
        "catch",
        "class",
        "const",
        "continue",
        "debugger",
        "default",
        "delete",
        "do",
        "else",
        "enum",
        "export",
        "extends",
        "false",
        "finally",
        "for",
        "function",
        "if",
        "import",
        "in",
        "instanceof",
        "new",
        "null",
        "return",
        "super",
        "switch",
        "this",
        "throw",
        "true",
        "try",
        "typeof",
        "var",
        "void",
        "while",
        "with",
        "implements",
        "interface",
        "let",
        "package",
        "private",
        "protected",
        "public",
        "static",
        "yield",
        "await",
        "async",
        "abstract",
        "any",
        "as",
        "asserts",
        "bigint",
        "boolean",
        "constructor",
        "declare",
        "get",
        "infer",
        "is",
        "keyof",
        "module",
        "namespace",
        "never",
        "number",
        "object",
        "of",
        "readonly",
        "require",
        "set",
        "string",
        "symbol",
        "type",
        "undefined",
        "unique",
        "unknown",
        "from",
        "global",
        "arguments",
        "eval",
        "accessor",
        "satisfies",
        "out",
        "override",
    ]
)


def ts_string(text: str) -> str:
    """A TypeScript string literal for `text` (JSON escaping, which TypeScript reads the same way)."""
    try:
        literal = json.dumps(text, ensure_ascii=False)
        literal.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: only the escaped form is valid UTF-8
        literal = json.dumps(text, ensure_ascii=True)
    return literal


def is_plain_identifier(name: str) -> bool:
    """True where `name` can be written bare as a member or property name and read unambiguously."""
    return bool(_PLAIN_IDENT.fullmatch(name)) and name not in RESERVED


@functools.lru_cache(maxsize=8192)
def member_key(name: str) -> str:
    """A property or method name: bare where it is a plain identifier, else a quoted string."""
    return name if is_plain_identifier(name) else ts_string(name)


def member_access(owner: str, name: str) -> str:
    """How a script reaches member `name` of `owner`: `github.list_issues` or `notion["API-get-user"]`."""
    return f"{owner}.{name}" if _PLAIN_IDENT.fullmatch(name) else f"{owner}[{ts_string(name)}]"


def split_tool_name(tool: ToolInfo) -> tuple[str | None, str]:
    """(namespace, member) of a tool: the namespace is the part before the first dot, None for a
    host tool with no group, which is then a top-level export."""
    head, dot, tail = tool.name.partition(".")
    if not dot:
        return None, tool.name
    return head, tail


def sanitize(name: str, fallback: str = "T") -> str:
    """An identifier made of `name`'s identifier characters (others become `_`), never reserved."""
    out = _NOT_IDENT_CHAR.sub("_", name) or fallback
    if out[0].isdigit():
        out = "_" + out
    if out in RESERVED:
        out += "_"
    return out


class Scope:
    """Hands out identifiers unique within one scope, derived from a wanted name; the same wanted
    names asked in the same order always give the same identifiers."""

    def __init__(self, taken: Iterable[str] = ()) -> None:
        self._taken = set(taken)

    def claim(self, wanted: str, fallback: str = "T") -> str:
        base = sanitize(wanted, fallback)
        name = base
        n = 2
        while name in self._taken:
            name = f"{base}_{n}"
            n += 1
        self._taken.add(name)
        return name
