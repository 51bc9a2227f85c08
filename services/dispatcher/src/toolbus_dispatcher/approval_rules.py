"""Whether a call waits for a decision: a tool's `approval` is `true`, `false`, or a rule
(`{"when": <JSON Schema>}`) over the call's input, tool and run. A rule is compiled once per
schema; one that cannot be evaluated for a call asks for approval, saying why."""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import jsonschema
import orjson
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from referencing.exceptions import Unresolvable
from toolbus_common.input_schemas import NO_RETRIEVAL
from toolbus_contracts.base import SCHEMA_DEPTH_MAX, nesting_depth
from toolbus_contracts.registry import ApprovalRule

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Verdict:
    """`ask`: the call waits for a decision; `error`: why the rule could not be evaluated."""

    ask: bool
    error: str | None = None


ALWAYS = Verdict(True)
NEVER = Verdict(False)


def uses_credentials(rule: ApprovalRule) -> bool:
    """Whether the rule may look at `run.credentials` (the dispatcher resolves it only then)."""
    return b'"credentials"' in orjson.dumps(rule.when)


class ApprovalRules:
    """Compiled rule schemas keyed by their JSON; bounded like the input schema cache."""

    def __init__(self, size: int = 1024) -> None:
        self._cache: OrderedDict[bytes, Validator | str] = OrderedDict()
        self._size = size

    def _compiled(self, rule: ApprovalRule) -> Validator | str:
        key = orjson.dumps(rule.when, option=orjson.OPT_SORT_KEYS)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = _compile(rule.when)
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return hit

    def verdict(self, approval: bool | ApprovalRule, subject: dict[str, Any]) -> Verdict:
        """Whether a call described by `subject` (`{"input", "tool", "run"}`) waits for approval."""
        if approval is True:
            return ALWAYS
        if approval is False:
            return NEVER
        compiled = self._compiled(approval)
        if isinstance(compiled, str):
            return Verdict(True, compiled)
        try:
            return Verdict(compiled.is_valid(subject))
        except RecursionError:
            return Verdict(True, "the call nests too deep for the approval rule to be evaluated")
        except Unresolvable as exc:
            ref = str(getattr(exc, "ref", "")) or "a reference"
            return Verdict(True, f"the approval rule refers to '{ref[:200]}', which is not in it")
        except Exception as exc:  # a rule is data: whatever it makes jsonschema raise asks a person
            log.warning("approval rule failed", extra={"error": type(exc).__name__})
            return Verdict(True, f"the approval rule failed: {type(exc).__name__}")


def _compile(schema: dict[str, Any]) -> Validator | str:
    """A validator, or why the rule cannot be evaluated (the registry refuses such rules; a
    toolset stored before it did may still hold one)."""
    if nesting_depth(schema) > SCHEMA_DEPTH_MAX:
        return f"the approval rule nests deeper than {SCHEMA_DEPTH_MAX} levels"
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        return f"the approval rule is not valid JSON Schema: {exc.message[:200]}"
    validator: Validator = cls(schema, format_checker=cls.FORMAT_CHECKER, registry=NO_RETRIEVAL)
    return validator
