"""Input checks against pinned input schemas, with validators compiled once per schema.

Draft 2020-12 unless the schema's `$schema` names another draft. A schema that is not valid JSON
Schema (an MCP server may pin anything) is not enforced rather than refusing every call.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from jsonschema.protocols import Validator
from toolbus_contracts.errors import InvalidInput

log = logging.getLogger(__name__)


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


class SchemaCache:
    """Compiled validators keyed by (toolset id, tool name): pinned schemas never change."""

    def __init__(self, size: int = 4096) -> None:
        self._cache: OrderedDict[tuple[str, str], Validator | None] = OrderedDict()
        self._size = size

    def validator(self, toolset_id: str, tool: str, schema: dict[str, Any]) -> Validator | None:
        key = (toolset_id, tool)
        try:
            hit = self._cache[key]
        except KeyError:
            hit = self._cache[key] = self._compile(tool, schema)
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return hit

    @staticmethod
    def _compile(tool: str, schema: dict[str, Any]) -> Validator | None:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        try:
            cls.check_schema(schema)
        except SchemaError as exc:
            log.warning(
                "pinned input schema is not valid JSON Schema; not enforced",
                extra={"tool": tool, "error": exc.message},
            )
            return None
        validator: Validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
        return validator

    def check(self, toolset_id: str, tool: str, schema: dict[str, Any], value: dict[str, Any]) -> None:
        """Raise `InvalidInput` naming the failing path when `value` fails the schema."""
        validator = self.validator(toolset_id, tool, schema)
        if validator is None:
            return
        error = best_match(validator.iter_errors(value))
        if error is None:
            return
        path = _path(error)
        raise InvalidInput(
            f"Input of '{tool}' is invalid at '{path}': {error.message[:300]}.",
            details={"path": path, "tool": tool},
        )
