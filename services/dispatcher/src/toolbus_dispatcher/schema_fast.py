"""A fast accept for the input schemas most tools pin: plain objects of typed properties.

`jsonschema` walks a schema through its keyword functions for every call (~25 µs for a
one-property object on the development machine). For a schema made only of `type`,
`properties`, `required`, `additionalProperties`, `items`, string `enum`s and annotations,
`fast_accept` compiles a predicate that says True only when `jsonschema` would accept the value
too. It never rejects: False means "not sure", and the caller asks `jsonschema`, which stays the
one judge of what is invalid and the one writer of the error (the failing path, its message).

Kept conservative where drafts differ: `integer` accepts Python ints only (draft 4 refuses 1.0,
later drafts accept it: the validator decides), a schema naming a `$schema` outside drafts 4 to
2020-12 gets no fast accept, and any other keyword (`format`, `$ref`, `pattern`, bounds...) leaves
the schema to `jsonschema` alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Accept = Callable[[Any], bool]

_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly"}
)
_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties", "items", "enum"})
_DRAFTS = frozenset(
    {
        "https://json-schema.org/draft/2020-12/schema",
        "https://json-schema.org/draft/2019-09/schema",
        "http://json-schema.org/draft-07/schema#",
        "http://json-schema.org/draft-07/schema",
        "http://json-schema.org/draft-06/schema#",
        "http://json-schema.org/draft-06/schema",
        "http://json-schema.org/draft-04/schema#",
        "http://json-schema.org/draft-04/schema",
    }
)
_TYPES: dict[str, Accept] = {
    "string": lambda v: type(v) is str,
    "integer": lambda v: type(v) is int,
    "number": lambda v: type(v) is int or type(v) is float,
    "boolean": lambda v: type(v) is bool,
    "object": lambda v: type(v) is dict,
    "array": lambda v: type(v) is list,
    "null": lambda v: v is None,
}


def _anything(_value: Any) -> bool:
    return True


def fast_accept(schema: Any) -> Accept | None:
    """A predicate that is True only for values `schema` accepts, or None when the schema uses
    anything beyond the plain keywords above."""
    if not isinstance(schema, dict):
        return None
    if "$schema" in schema and schema["$schema"] not in _DRAFTS:
        return None
    return _compile({k: v for k, v in schema.items() if k != "$schema"})


def _compile(schema: Any) -> Accept | None:
    if not isinstance(schema, dict):
        return None
    if any(k not in _KEYWORDS and k not in _ANNOTATIONS for k in schema):
        return None
    checks: list[Accept] = []
    if "type" in schema:
        kind = _type_check(schema["type"])
        if kind is None:
            return None
        checks.append(kind)
    if "enum" in schema:
        allowed = schema["enum"]
        if not isinstance(allowed, list) or not allowed or not all(type(a) is str for a in allowed):
            return None
        names = frozenset(allowed)
        checks.append(lambda v: type(v) is str and v in names)
    if any(k in schema for k in ("properties", "required", "additionalProperties")):
        members = _object_check(schema)
        if members is None:
            return None
        checks.append(members)
    if "items" in schema:
        item = _compile(schema["items"])
        if item is None:
            return None
        checks.append(lambda v: type(v) is not list or all(item(i) for i in v))
    if not checks:
        return _anything
    if len(checks) == 1:
        return checks[0]
    return lambda v: all(check(v) for check in checks)


def _type_check(kind: Any) -> Accept | None:
    names = [kind] if isinstance(kind, str) else kind
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n in _TYPES for n in names):
        return None
    preds = [_TYPES[n] for n in names]
    if len(preds) == 1:
        return preds[0]
    return lambda v: any(p(v) for p in preds)


def _object_check(schema: dict[str, Any]) -> Accept | None:
    props = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(props, dict) or not isinstance(required, list):
        return None
    if not all(isinstance(r, str) for r in required):
        return None
    known: dict[str, Accept] = {}
    for name, sub in props.items():
        check = _compile(sub)
        if check is None:
            return None
        known[name] = check
    if extra is True:
        other: Accept | None = _anything
    elif extra is False:
        other = None
    else:
        other = _compile(extra)
        if other is None:
            return None
    needed = tuple(required)

    def members(value: Any) -> bool:
        if type(value) is not dict:
            return True  # these keywords apply to objects only
        for name in needed:
            if name not in value:
                return False
        for name, item in value.items():
            check = known.get(name, other)
            if check is None or not check(item):
                return False
        return True

    return members
