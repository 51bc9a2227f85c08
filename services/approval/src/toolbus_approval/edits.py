"""An edited input checked against its tool's input schema before a decision sends it: the
dispatcher's own check (`toolbus_common.input_schemas`: same draft, RE2 patterns, nothing
fetched), a refusal being `invalidRequest` naming `input`."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Protocol

from toolbus_common.input_schemas import Compiled, ajudge, compile_schema
from toolbus_contracts.errors import InvalidRequest


class Schemas(Protocol):
    """Where a tool's input schema comes from (the toolsets object store)."""

    async def input_schema(self, toolset_id: str, tool: str) -> dict[str, Any] | None:
        """The tool's pinned input schema, or None when the toolset or tool is unknown."""


class EditCheck:
    """Checks edited inputs; compiled once per (toolset, tool): pinned schemas never change."""

    def __init__(self, schemas: Schemas, size: int = 1024) -> None:
        self._schemas = schemas
        self._cache: OrderedDict[tuple[str, str], Compiled | None] = OrderedDict()
        self._size = size

    async def check(self, toolset_id: str, tool: str, edited: dict[str, Any]) -> None:
        """Raise `invalidRequest` naming `input` (and the failing path) when `edited` is not an
        input the tool accepts."""
        key = (toolset_id, tool)
        if key in self._cache:
            compiled = self._cache[key]
        else:
            schema = await self._schemas.input_schema(toolset_id, tool)
            if schema is None:
                raise InvalidRequest(
                    f"Field 'input' cannot be checked: tool '{tool}' of toolset '{toolset_id}' is not "
                    "stored any more; approve without an edit or deny.",
                    details={"field": "input"},
                )
            compiled = self._cache[key] = compile_schema(tool, schema)
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        if compiled is not None and (refusal := await ajudge(compiled, edited)) is not None:
            raise InvalidRequest(
                f"Field 'input' of '{tool}' {refusal.reason}.",
                details={**refusal.details, "field": "input"},
            )
