"""Glue between the registry and the search package: one index per content-addressed toolset
(built once, cached: an id never changes content), hits with their prompt line and dts fragment."""

from __future__ import annotations

from toolbus_common.toolsets import StoredToolset
from toolbus_contracts import ToolsetSearchReply
from toolbus_registry.declarations import tool_dts_fragment, tool_prompt_line
from toolbus_registry.search import IndexCache, to_hits


class Searcher:
    """Synchronous and CPU-bound: the registry runs it off the event loop."""

    def __init__(self, cache_size: int = 32) -> None:
        self._cache = IndexCache(cache_size)

    def search(self, stored: StoredToolset, query: str, limit: int) -> ToolsetSearchReply:
        index = self._cache.get_or_build(stored.id, stored.table.infos)
        hits = to_hits(index.search(query, limit), tool_prompt_line, tool_dts_fragment)
        return ToolsetSearchReply(tools=hits)
