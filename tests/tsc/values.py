"""Inputs for the type-check gate: values a schema accepts and near misses it refuses.

Candidates are built from the schema's keywords, then judged by `jsonschema`: a value counts as
valid only if the validator accepts it and as invalid only if the validator refuses it, so the
gate never trusts this generator's reading of JSON Schema.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError
from toolbus_registry.declarations.schema_to_ts import resolve_pointer, schema_types

_SAMPLE_STRINGS = {
    "date-time": "2024-01-02T03:04:05Z",
    "date": "2024-01-02",
    "time": "03:04:05Z",
    "email": "a@example.com",
    "uri": "https://example.com/x",
    "url": "https://example.com/x",
    "uuid": "123e4567-e89b-12d3-a456-426614174000",
}


@dataclass(frozen=True)
class Case:
    """One call of the gate: an input and whether the schema accepts it."""

    input: Any
    valid: bool
    label: str


def validator(schema: Any) -> jsonschema.protocols.Validator | None:
    """A validator for `schema`, or None where it is not valid JSON Schema."""
    if not isinstance(schema, dict | bool):
        return None
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)  # type: ignore[arg-type]  # its stub: dict only; boolean schemas are valid
    except (SchemaError, RecursionError):
        return None
    return cls(schema)


class _Gen:
    def __init__(self, root: Any) -> None:
        self.root = root

    def candidates(self, schema: Any, depth: int = 0) -> list[Any]:
        if depth > 8 or schema is False:
            return []
        if schema is True or not isinstance(schema, dict):
            return ["x", 1, None]
        ref = schema.get("$ref")
        if isinstance(ref, str):
            target = resolve_pointer(self.root, ref)
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            base = self.candidates(target, depth + 1) if target is not None else ["x"]
            return [_merge(b, r) for b in base for r in (self.candidates(rest, depth + 1) or [b])][:6]
        if "const" in schema:
            return [schema["const"]]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return [schema["enum"][0], schema["enum"][-1]]
        out: list[Any] = []
        types = schema_types(schema) or []
        for kind in types:
            out.extend(self._typed(kind, schema, depth))
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list):
                merged: list[Any] = []
                for branch in branches:
                    for value in self.candidates(branch, depth + 1)[:2]:
                        merged.extend(_merge(b, value) for b in (out or [value]))
                out = merged
        all_of = schema.get("allOf")
        if isinstance(all_of, list):
            for part in all_of:
                values = self.candidates(part, depth + 1)[:2] or [None]
                out = [_merge(b, v) for b in (out or values) for v in values]
        if not out and not types:
            out = ["x", 1, {"k": True}]
        return out[:8]

    def _typed(self, kind: str, schema: dict[str, Any], depth: int) -> list[Any]:
        if kind == "string":
            fmt = schema.get("format")
            text = _SAMPLE_STRINGS.get(fmt, "x") if isinstance(fmt, str) else "x"
            min_len = schema.get("minLength")
            if isinstance(min_len, int) and len(text) < min_len:
                text = text * min_len
            return [text]
        if kind in ("number", "integer"):
            low = schema.get("minimum", schema.get("exclusiveMinimum"))
            value = int(low) + 1 if isinstance(low, int | float) else 1
            return [value]
        if kind == "boolean":
            return [True]
        if kind == "null":
            return [None]
        if kind == "array":
            prefix = schema.get("prefixItems")
            if not isinstance(prefix, list) and isinstance(schema.get("items"), list):
                prefix = schema["items"]
            if isinstance(prefix, list):
                values = [(self.candidates(s, depth + 1) or [None])[0] for s in prefix]
                return [values, values[: schema.get("minItems", 0) or 0]]
            item = (self.candidates(schema.get("items", True), depth + 1) or [None])[0]
            count = max(schema.get("minItems", 1) if isinstance(schema.get("minItems"), int) else 1, 1)
            return [[item] * count, []]
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        assert isinstance(props, dict)
        required = (
            [r for r in schema.get("required", []) if isinstance(r, str)]
            if isinstance(schema.get("required"), list)
            else []
        )
        full: dict[str, Any] = {}
        minimal: dict[str, Any] = {}
        for key, sub in props.items():
            values = self.candidates(sub, depth + 1)
            if values:
                full[key] = values[0]
                if key in required:
                    minimal[key] = values[0]
        for key in required:
            minimal.setdefault(key, "x")
            full.setdefault(key, "x")
        out = [full, minimal]
        if schema.get("additionalProperties", True) is not False:
            out.append({**minimal, "extra_key": "x"})
        return out


def _merge(a: Any, b: Any) -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        return {**a, **b}
    return b if b is not None else a


def _mutations(value: Any, schema: Any, root: Any) -> Iterator[tuple[str, Any]]:
    """Near misses of a valid object input: each breaks one rule a type can say."""
    if not isinstance(value, dict) or not isinstance(schema, dict):
        return
    while isinstance(schema.get("$ref"), str):
        target = resolve_pointer(root, schema["$ref"])
        if not isinstance(target, dict):
            return
        schema = target
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    assert isinstance(props, dict)
    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    assert isinstance(required, list)
    for key in required:
        if key in value:
            yield f"missing required {key}", {k: v for k, v in value.items() if k != key}
            wrong = 12345 if isinstance(value[key], str) else "wrong type"
            yield f"wrong type for {key}", {**value, key: wrong}
    if schema.get("additionalProperties", True) is False:
        yield "unknown property", {**value, "zz_not_a_property": 1}
    for key, sub in props.items():
        if isinstance(sub, dict) and isinstance(sub.get("enum"), list) and key in value:
            yield f"{key} outside enum", {**value, key: "zz_not_in_enum"}
        if isinstance(sub, dict) and isinstance(value.get(key), dict):
            for label, inner in _mutations(value[key], sub, root):
                yield f"{key}: {label}", {**value, key: inner}


def cases(schema: Any, max_valid: int = 3, max_invalid: int = 6) -> list[Case]:
    """Valid and invalid inputs for `schema`, each confirmed by `jsonschema`; [] when the schema is
    not valid JSON Schema (or has references that lead nowhere)."""
    try:
        return _cases(schema, max_valid, max_invalid)
    except (jsonschema.exceptions._WrappedReferencingError, RecursionError):  # type: ignore[attr-defined]  # private, not in its stub
        return []


def _cases(schema: Any, max_valid: int, max_invalid: int) -> list[Case]:
    check = validator(schema)
    if check is None:
        return []
    gen = _Gen(schema)
    out: list[Case] = []
    seen: set[str] = set()
    valid_values: list[Any] = []
    for value in gen.candidates(schema):
        key = repr(value)
        if key in seen or _has_proto(value):
            continue
        seen.add(key)
        if check.is_valid(value):
            valid_values.append(value)
            if len(valid_values) <= max_valid:
                out.append(Case(copy.deepcopy(value), True, "valid"))
    invalid = 0
    for value in valid_values[:2]:
        for label, mutated in _mutations(value, schema, schema):
            key = repr(mutated)
            if key in seen or invalid >= max_invalid:
                continue
            seen.add(key)
            if not check.is_valid(mutated):
                out.append(Case(mutated, False, label))
                invalid += 1
    return out


def _has_proto(value: Any) -> bool:
    if isinstance(value, dict):
        return "__proto__" in value or any(_has_proto(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_proto(v) for v in value)
    return False
