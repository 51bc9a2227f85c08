"""One way to check a value against a tool's pinned input schema, used by the dispatcher (a call's
input) and the approval service (an edited input): the same draft, patterns, references and
refusal wording.

Draft 2020-12 unless the schema's `$schema` names another draft. A schema that is not valid JSON
Schema (an MCP server may pin anything), or that nests deeper than `SCHEMA_DEPTH_MAX`, is not
enforced rather than refusing every value. Patterns are matched by RE2 (`schema_patterns`); a
schema with a pattern only the bounded fallback engine runs is `slow` (`ajudge` checks it off the
event loop). A `$ref` resolves within the schema (and the drafts' meta-schemas) only: nothing is
fetched. A value `schema_fast` accepts is valid without walking `jsonschema`, which stays the one
writer of a refusal.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, NamedTuple

import jsonschema
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from jsonschema.protocols import Validator
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable
from toolbus_contracts.base import SCHEMA_DEPTH_MAX, nesting_depth

from toolbus_common import schema_patterns
from toolbus_common.schema_fast import Accept, fast_accept

log = logging.getLogger(__name__)


def _never_fetch(uri: str) -> Any:
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # attrs-made __init__, unseen by mypy


NO_RETRIEVAL: Registry[Any] = Registry(retrieve=_never_fetch)  # type: ignore[call-arg]  # attrs __init__
"""References outside the schema are never retrieved (jsonschema would otherwise fetch them)."""


class Compiled(NamedTuple):
    """A schema's validator (RE2 patterns), its fast accept (or None) and whether it is `slow`."""

    validator: Validator
    accept: Accept | None
    slow: bool


class Refusal(NamedTuple):
    """Why a value was refused: `reason` reads after the value's name ("Input of 't' " + reason),
    `details` holds the failing `path`, the unresolved `ref` or the timed-out `pattern`."""

    reason: str
    details: dict[str, str]


_EXTENDED: dict[type[Validator], type[Validator]] = {}


def _linear(cls: type[Validator]) -> type[Validator]:
    """`cls` with the pattern keywords of `schema_patterns` (RE2) in place of its own (Python's `re`)."""
    hit = _EXTENDED.get(cls)
    if hit is None:
        hit = _EXTENDED[cls] = jsonschema.validators.extend(cls, schema_patterns.KEYWORDS)  # type: ignore[no-untyped-call]
    return hit


def compile_schema(tool: str, schema: dict[str, Any]) -> Compiled | None:
    """The compiled check of `tool`'s input schema, or None (logged) for a schema not enforced."""
    if nesting_depth(schema) > SCHEMA_DEPTH_MAX:  # an MCP server's: checking it would exhaust the stack
        log.warning(
            "pinned input schema nests too deep to check; not enforced",
            extra={"tool": tool, "limit": SCHEMA_DEPTH_MAX},
        )
        return None
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        log.warning(
            "pinned input schema is not valid JSON Schema; not enforced",
            extra={"tool": tool, "error": exc.message},
        )
        return None
    try:
        slow = schema_patterns.slow_patterns(schema)
    except schema_patterns.BadPattern as exc:
        log.warning(
            "pinned input schema has a pattern no engine compiles; not enforced",
            extra={"tool": tool, "error": str(exc)[:200]},
        )
        return None
    validator: Validator = _linear(cls)(schema, format_checker=cls.FORMAT_CHECKER, registry=NO_RETRIEVAL)
    return Compiled(validator, fast_accept(schema), slow)


def _path(error: ValidationError) -> str:
    path = "$"
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    if error.validator == "required" and isinstance(error.instance, dict):
        required: Any = error.validator_value
        missing = [p for p in required if p not in error.instance]
        if missing:
            path += f".{missing[0]}"
    return path


def judge(compiled: Compiled, value: Any) -> Refusal | None:
    """None when `value` is valid, else why not. In this thread: see `ajudge` for a `slow` schema."""
    if compiled.accept is not None and compiled.accept(value):
        return None
    try:
        error = best_match(compiled.validator.iter_errors(value))
    except RecursionError:  # a recursive schema ($ref to itself) walking a value nested ~200 deep
        return Refusal("nests too deep to be checked against its schema", {})
    except Unresolvable as exc:
        ref = (str(getattr(exc, "ref", "")) or "a reference")[:200]
        return Refusal(
            f"cannot be checked: its schema refers to '{ref}', which is not in the schema "
            "(toolbus does not fetch schema references)",
            {"ref": ref},
        )
    except schema_patterns.PatternTimeout as exc:
        pattern = exc.pattern[:100]
        return Refusal(
            f"could not be checked against its schema's pattern '{pattern}' within "
            f"{schema_patterns.FALLBACK_SECONDS:g} s (a pattern with lookaround or backreferences, "
            "matched by a backtracking engine); it was refused",
            {"pattern": pattern},
        )
    if error is None:
        return None
    path = _path(error)
    return Refusal(f"is invalid at '{path}': {error.message[:300]}", {"path": path})


def _bounded(compiled: Compiled, value: Any) -> Refusal | None:
    schema_patterns.within(schema_patterns.FALLBACK_SECONDS)
    try:
        return judge(compiled, value)
    finally:
        schema_patterns.unbounded()


async def ajudge(compiled: Compiled, value: Any) -> Refusal | None:
    """`judge`, in a worker thread with the fallback patterns' time bound for a `slow` schema, so
    no value stalls the event loop."""
    if compiled.slow:
        return await asyncio.to_thread(_bounded, compiled, value)
    return judge(compiled, value)
