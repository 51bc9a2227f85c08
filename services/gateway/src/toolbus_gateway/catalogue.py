"""A toolset's tools as MCP `Tool`s (qualified names; title, description, schemas and
annotations as pinned), read from the toolsets object store and cached by id (a toolset id names
content that never changes), paged for `tools/list`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mcp_types as types
from toolbus_common.lru import Lru
from toolbus_common.toolsets import ToolsetStore, mcp_tool_name


@dataclass(frozen=True)
class Catalogue:
    """One toolset's tools, sorted by name."""

    toolset_id: str
    tools: tuple[types.Tool, ...]
    schemas: dict[str, dict[str, Any]]

    def page(self, cursor: str | None, size: int) -> tuple[list[types.Tool], str | None]:
        """The page at `cursor` (an offset; None: the first) and the next cursor. A cursor this
        catalogue never gave is ValueError."""
        start = 0
        if cursor is not None:
            if not cursor.isdigit() or int(cursor) > len(self.tools):
                raise ValueError("cursor")
            start = int(cursor)
        end = start + size
        return list(self.tools[start:end]), (str(end) if end < len(self.tools) else None)


def _annotations(raw: dict[str, Any] | None) -> types.ToolAnnotations | None:
    if not raw:
        return None
    try:
        return types.ToolAnnotations.model_validate(raw)
    except Exception:  # a server's odd annotations are not worth refusing the listing for
        return None


class Catalogues:
    """Catalogues by toolset id."""

    def __init__(self, store: ToolsetStore, *, cache_size: int = 64) -> None:
        self._store = store
        self._cache: Lru[str, Catalogue] = Lru(cache_size)

    async def get(self, toolset_id: str) -> Catalogue | None:
        hit = self._cache.get(toolset_id)
        if hit is not None:
            return hit
        stored = await self._store.get(toolset_id)
        if stored is None:
            return None
        pinned = {mcp_tool_name(s.name, t.name): t for s in stored.pinned.servers for t in s.tools}
        tools: list[types.Tool] = []
        schemas: dict[str, dict[str, Any]] = {}
        for tool in stored.table.tools:
            wire = tool.wire
            source = pinned.get(tool.name) if tool.kind == "mcp" else None
            tools.append(
                types.Tool(
                    name=tool.name,
                    title=source.title if source is not None else None,
                    description=(source.description if source is not None else wire["description"]) or None,
                    input_schema=wire["inputSchema"],
                    output_schema=wire.get("outputSchema"),
                    annotations=_annotations(source.annotations if source is not None else None),
                )
            )
            schemas[tool.name] = wire["inputSchema"]
        catalogue = Catalogue(toolset_id, tuple(tools), schemas)
        self._cache.put(toolset_id, catalogue)
        return catalogue
