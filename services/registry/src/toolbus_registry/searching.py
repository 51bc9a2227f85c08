"""Glue between the registry and the search package: one index per content-addressed toolset
(built once, cached: an id never changes content), hits with their prompt line and dts fragment."""

from __future__ import annotations

from toolbus_common.toolsets import StoredToolset
from toolbus_contracts import ToolsetSearchReply

from toolbus_registry.declarations import tool_dts_fragment, tool_prompt_line
from toolbus_registry.search import IndexCache, SearchOptions, to_hits

DENSE_ALL_MAX = 200
"""Toolsets up to this size are re-ranked over every tool, embedded once in the background when
registered (~20 ms a tool on 2 cores); larger ones re-rank their lexical top 40, so no search
ever waits for more than 40 tools to be embedded."""


class Searcher:
    """Synchronous and CPU-bound: the registry runs it off the event loop."""

    def __init__(self, cache_size: int = 32) -> None:
        self._cache = IndexCache(cache_size, SearchOptions(dense_all_max=DENSE_ALL_MAX))

    def warm(self, stored: StoredToolset) -> None:
        """Build the index and embed its tools now, so the first search does not pay for it."""
        index = self._cache.get_or_build(stored.id, stored.table.infos)
        if len(index) <= index.options.dense_all_max:
            index.warm()

    def search(self, stored: StoredToolset, query: str, limit: int) -> ToolsetSearchReply:
        index = self._cache.get_or_build(stored.id, stored.table.infos)
        hits = to_hits(index.search(query, limit), tool_prompt_line, tool_dts_fragment)
        return ToolsetSearchReply(tools=hits)
