"""Schema `pattern`s matched by an engine that cannot backtrack, plugged into `jsonschema` as its
`pattern`, `patternProperties` and `additionalProperties` keywords.

An input schema is an MCP server's, and inputs are a model's: `"^(a+)+$"` against 28 `a`s and a
`!` costs Python's `re` 16 s, doubling with each character. RE2 (`google-re2`) matches in time
linear in the input, whatever the pattern. RE2 lacks what needs backtracking (lookaround,
backreferences, `\\Z`): such a pattern is matched by `regex` with a time bound (`FALLBACK_SECONDS`),
and a schema with one is checked off the event loop (`Pattern.slow`); a match that runs out of
time is `PatternTimeout` (the input is refused as not checkable). `\\d`, `\\w`, `\\s` are ASCII
under RE2, as ECMA-262 (which JSON Schema names) has them.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from typing import Any

import re2
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

FALLBACK_SECONDS = 0.25
"""The longest the patterns RE2 cannot run (lookaround, backreferences) may take, in all, on one
input (`within` sets the bound of the check running in this thread)."""

_bound = threading.local()

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is expected, not an error to print on stderr


class BadPattern(Exception):
    """Neither engine compiles the pattern."""


class PatternTimeout(Exception):
    """A fallback pattern took longer than `FALLBACK_SECONDS` on a value."""

    def __init__(self, pattern: str) -> None:
        super().__init__(pattern)
        self.pattern = pattern


class Pattern:
    """One compiled schema pattern; `slow` when it is matched by the bounded fallback engine."""

    __slots__ = ("_compiled", "slow", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        try:
            self._compiled: Any = re2.compile(source, _OPTIONS)
            self.slow = False
        except re2.error:
            import regex  # only for patterns RE2 refuses: most processes never load it

            try:
                self._compiled = regex.compile(source)
            except regex.error as exc:
                raise BadPattern(str(exc)) from None
            self.slow = True

    def search(self, text: str) -> bool:
        """True when the pattern matches somewhere in `text` (JSON Schema's `pattern` is unanchored)."""
        if not self.slow:
            return self._compiled.search(text) is not None
        deadline = getattr(_bound, "deadline", None)
        left = FALLBACK_SECONDS if deadline is None else deadline - time.monotonic()
        if left <= 0:
            raise PatternTimeout(self.source)
        try:
            return self._compiled.search(text, timeout=left) is not None
        except TimeoutError:
            raise PatternTimeout(self.source) from None


def within(seconds: float) -> None:
    """Bound the fallback matching this thread does from now on to `seconds` in all, until
    `unbounded` (then each value alone gets `FALLBACK_SECONDS`)."""
    _bound.deadline = time.monotonic() + seconds


def unbounded() -> None:
    _bound.deadline = None


@functools.lru_cache(maxsize=4096)
def compiled(source: str) -> Pattern:
    """The `Pattern` of `source`, compiled once per process (pinned schemas repeat them)."""
    return Pattern(source)


def slow_patterns(schema: Any) -> bool:
    """True when some `pattern` or `patternProperties` key in `schema` needs the fallback engine:
    such a schema is checked off the event loop. `BadPattern` for one neither engine compiles."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        sources: list[Any] = []
        if isinstance(node.get("pattern"), str):
            sources.append(node["pattern"])
        if isinstance(node.get("patternProperties"), dict):
            sources.extend(node["patternProperties"])
        for source in sources:
            if isinstance(source, str) and compiled(source).slow:
                return True
        stack.extend(node.values())
    return False


def _descend(validator: Validator, instance: Any, schema: Any, **where: Any) -> Iterator[ValidationError]:
    """`descend` of jsonschema's validators (public on them, though not in its `Validator` protocol)."""
    errors: Iterator[ValidationError] = getattr(validator, "descend")(instance, schema, **where)  # noqa: B009
    return errors


# The keywords below are jsonschema 4's own (`jsonschema._keywords`), with `re.search` replaced.


def pattern(validator: Validator, patrn: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not compiled(patrn).search(instance):
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


def pattern_properties(
    validator: Validator, patterns: dict[str, Any], instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for source, subschema in patterns.items():
        matcher = compiled(source)
        for key, value in instance.items():
            if matcher.search(key):
                yield from _descend(validator, value, subschema, path=key, schema_path=source)


def _additional(instance: dict[str, Any], schema: dict[str, Any]) -> Iterator[str]:
    properties = schema.get("properties", {})
    matchers = [compiled(p) for p in schema.get("patternProperties", {})]
    for key in instance:
        if key not in properties and not any(m.search(key) for m in matchers):
            yield key


def additional_properties(
    validator: Validator, allowed: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    extras = set(_additional(instance, schema))
    if validator.is_type(allowed, "object"):
        for extra in extras:
            yield from _descend(validator, instance[extra], allowed, path=extra)
    elif not allowed and extras:
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            patterns = ", ".join(repr(each) for each in sorted(schema["patternProperties"]))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {patterns}")
        else:
            were = "was" if len(extras) == 1 else "were"
            listed = ", ".join(repr(each) for each in sorted(extras, key=str))
            yield ValidationError(f"Additional properties are not allowed ({listed} {were} unexpected)")


KEYWORDS = {
    "pattern": pattern,
    "patternProperties": pattern_properties,
    "additionalProperties": additional_properties,
}
"""The keywords `input_schemas` puts in place of jsonschema's (`jsonschema.validators.extend`)."""
