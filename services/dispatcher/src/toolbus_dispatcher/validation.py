"""Input checks against pinned input schemas, with validators compiled once per schema.

Draft 2020-12 unless the schema's `$schema` names another draft. A schema that is not valid JSON
Schema (an MCP server may pin anything), or that nests deeper than `SCHEMA_DEPTH_MAX`, is not
enforced rather than refusing every call.

Patterns (`pattern`, `patternProperties`) are matched by RE2, which cannot backtrack (`patterns`);
a schema with a pattern only the bounded fallback engine runs is checked off the event loop, so
no input stalls another call, and an input whose patterns take longer than
`patterns.FALLBACK_SECONDS` in all is `invalidInput` saying so. A `$ref` resolves within the schema (and the drafts' own
meta-schemas) only: nothing is fetched, so a schema cannot make the dispatcher send a request (past
the allow-list) or wait on one; an input whose check needs a reference that does not resolve is
`invalidInput` saying so.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from jsonschema.protocols import Validator
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable
from toolbus_contracts.base import SCHEMA_DEPTH_MAX, nesting_depth
from toolbus_contracts.errors import InvalidInput

from toolbus_dispatcher import patterns
from toolbus_dispatcher.schema_fast import Accept, fast_accept

log = logging.getLogger(__name__)


def _never_fetch(uri: str) -> Any:
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # attrs-made __init__, unseen by mypy


NO_RETRIEVAL: Registry[Any] = Registry(retrieve=_never_fetch)  # type: ignore[call-arg]  # attrs __init__
"""References outside the schema are never retrieved (jsonschema would otherwise fetch them)."""


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


_EXTENDED: dict[type[Validator], type[Validator]] = {}


def _linear(cls: type[Validator]) -> type[Validator]:
    """`cls` with the pattern keywords of `patterns` (RE2) in place of its own (Python's `re`)."""
    hit = _EXTENDED.get(cls)
    if hit is None:
        hit = _EXTENDED[cls] = jsonschema.validators.extend(cls, patterns.KEYWORDS)  # type: ignore[no-untyped-call]
    return hit


Compiled = tuple[Validator, Accept | None, bool]
"""A schema's validator, its fast accept (or None) and whether it is checked off the loop."""


class SchemaCache:
    """Compiled validators keyed by (toolset id, tool name): pinned schemas never change. Each
    comes with the schema's fast accept (`schema_fast`), when it has one: a value it accepts is
    valid without walking `jsonschema`; anything else is judged by the validator."""

    def __init__(self, size: int = 4096) -> None:
        self._cache: OrderedDict[tuple[str, str], Compiled | None] = OrderedDict()
        self._size = size

    def compiled(self, toolset_id: str, tool: str, schema: dict[str, Any]) -> Compiled | None:
        """(validator, fast accept or None, off the loop), or None for a schema not enforced."""
        key = (toolset_id, tool)
        try:
            return self._cache[key]
        except KeyError:
            hit = self._cache[key] = self._compile(tool, schema)
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
            return hit

    def validator(self, toolset_id: str, tool: str, schema: dict[str, Any]) -> Validator | None:
        hit = self.compiled(toolset_id, tool, schema)
        return hit[0] if hit is not None else None

    @staticmethod
    def _compile(tool: str, schema: dict[str, Any]) -> Compiled | None:
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
            slow = patterns.slow_patterns(schema)
        except patterns.BadPattern as exc:
            log.warning(
                "pinned input schema has a pattern no engine compiles; not enforced",
                extra={"tool": tool, "error": str(exc)[:200]},
            )
            return None
        linear = _linear(cls)
        validator: Validator = linear(schema, format_checker=cls.FORMAT_CHECKER, registry=NO_RETRIEVAL)
        return validator, fast_accept(schema), slow

    async def validate(
        self, toolset_id: str, tool: str, schema: dict[str, Any], value: dict[str, Any]
    ) -> None:
        """`check`, off the event loop for a schema whose patterns need the bounded fallback."""
        hit = self.compiled(toolset_id, tool, schema)
        if hit is not None and hit[2]:
            await asyncio.to_thread(self._bounded, hit, tool, value)
        else:
            self.check(toolset_id, tool, schema, value)

    def _bounded(self, hit: Compiled, tool: str, value: dict[str, Any]) -> None:
        patterns.within(patterns.FALLBACK_SECONDS)
        try:
            self._judge(hit, tool, value)
        finally:
            patterns.unbounded()

    def check(self, toolset_id: str, tool: str, schema: dict[str, Any], value: dict[str, Any]) -> None:
        """Raise `InvalidInput` naming the failing path when `value` fails the schema."""
        hit = self.compiled(toolset_id, tool, schema)
        if hit is not None:
            self._judge(hit, tool, value)

    @staticmethod
    def _judge(hit: Compiled, tool: str, value: dict[str, Any]) -> None:
        validator, accept, _ = hit
        if accept is not None and accept(value):
            return
        try:
            error = best_match(validator.iter_errors(value))
        except RecursionError:  # a recursive schema ($ref to itself) walking an input nested ~200 deep
            raise InvalidInput(
                f"Input of '{tool}' nests too deep to be checked against its schema.", details={"tool": tool}
            ) from None
        except Unresolvable as exc:
            ref = str(getattr(exc, "ref", "")) or "a reference"
            raise InvalidInput(
                f"The input schema of '{tool}' refers to '{ref[:200]}', which is not in the schema; "
                "toolbus does not fetch schema references, so this input cannot be checked.",
                details={"tool": tool, "ref": ref[:200]},
            ) from None
        except patterns.PatternTimeout as exc:
            raise InvalidInput(
                f"Input of '{tool}' could not be checked against its schema's pattern "
                f"'{exc.pattern[:100]}' within {patterns.FALLBACK_SECONDS:g} s (a pattern with "
                "lookaround or backreferences, matched by a backtracking engine); it was refused.",
                details={"tool": tool, "pattern": exc.pattern[:100]},
            ) from None
        if error is None:
            return
        path = _path(error)
        raise InvalidInput(
            f"Input of '{tool}' is invalid at '{path}': {error.message[:300]}.",
            details={"path": path, "tool": tool},
        )
