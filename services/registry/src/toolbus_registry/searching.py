"""Glue between the registry and the search index: one index per content-addressed toolset, built
once and cached (a toolset id never changes content), hits rendered with their prompt line and dts
fragment."""

from __future__ import annotations

import threading
from collections import OrderedDict

from toolbus_common.toolsets import StoredToolset
from toolbus_contracts import ToolsetSearchReply
from toolbus_contracts.registry import SearchHit
from toolbus_registry.declarations import tool_dts_fragment, tool_prompt_line
from toolbus_registry.search.index import SearchIndex


class Searcher:
    """Synchronous and CPU-bound: the registry runs it off the event loop."""

    def __init__(self, cache_size: int = 32) -> None:
        self._indexes: OrderedDict[str, SearchIndex] = OrderedDict()
        self._size = cache_size
        self._lock = threading.Lock()

    def index(self, stored: StoredToolset) -> SearchIndex:
        with self._lock:
            hit = self._indexes.get(stored.id)
            if hit is not None:
                self._indexes.move_to_end(stored.id)
                return hit
        built = SearchIndex.build(stored.table.infos())
        with self._lock:
            self._indexes[stored.id] = built
            while len(self._indexes) > self._size:
                self._indexes.popitem(last=False)
        return built

    def search(self, stored: StoredToolset, query: str, limit: int) -> ToolsetSearchReply:
        hits = [
            SearchHit(
                name=hit.tool.name,
                prompt=tool_prompt_line(hit.tool),
                dts=tool_dts_fragment(hit.tool),
                score=round(float(hit.score), 4),
            )
            for hit in self.index(stored).search(query, limit)
        ]
        return ToolsetSearchReply(tools=hits)
