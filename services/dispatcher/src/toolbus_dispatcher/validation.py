"""A call's input checked against its tool's pinned input schema (`toolbus_common.input_schemas`:
RE2 patterns, nothing fetched, a schema not enforced when it cannot be), with the check compiled
once per tool; a refusal is `invalidInput` naming the tool and the failing path."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from jsonschema.protocols import Validator
from toolbus_common.input_schemas import Compiled, Refusal, ajudge, compile_schema, judge
from toolbus_contracts.errors import InvalidInput


def _refused(tool: str, refusal: Refusal) -> InvalidInput:
    return InvalidInput(f"Input of '{tool}' {refusal.reason}.", details={**refusal.details, "tool": tool})


class SchemaCache:
    """Compiled checks keyed by (toolset id, tool name): pinned schemas never change."""

    def __init__(self, size: int = 4096) -> None:
        self._cache: OrderedDict[tuple[str, str], Compiled | None] = OrderedDict()
        self._size = size

    def compiled(self, toolset_id: str, tool: str, schema: dict[str, Any]) -> Compiled | None:
        """The tool's compiled check, or None for a schema not enforced."""
        key = (toolset_id, tool)
        try:
            return self._cache[key]
        except KeyError:
            hit = self._cache[key] = compile_schema(tool, schema)
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
            return hit

    def validator(self, toolset_id: str, tool: str, schema: dict[str, Any]) -> Validator | None:
        hit = self.compiled(toolset_id, tool, schema)
        return hit.validator if hit is not None else None

    async def validate(
        self, toolset_id: str, tool: str, schema: dict[str, Any], value: dict[str, Any]
    ) -> None:
        """`check`, off the event loop for a schema whose patterns need the bounded fallback."""
        hit = self.compiled(toolset_id, tool, schema)
        if hit is None or (not hit.slow and hit.accept is not None and hit.accept(value)):  # the hot path
            return
        if (refusal := await ajudge(hit, value)) is not None:
            raise _refused(tool, refusal)

    def check(self, toolset_id: str, tool: str, schema: dict[str, Any], value: dict[str, Any]) -> None:
        """Raise `InvalidInput` naming the failing path when `value` fails the schema."""
        hit = self.compiled(toolset_id, tool, schema)
        if hit is None or (hit.accept is not None and hit.accept(value)):  # the hot path
            return
        if (refusal := judge(hit, value)) is not None:
            raise _refused(tool, refusal)
