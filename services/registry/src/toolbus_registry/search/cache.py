"""Search indexes by toolset id, bounded. A toolset id addresses its content, so an index never
goes stale: entries only leave when the cache is full (least recently used first)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

from toolbus_contracts import ToolInfo

from toolbus_registry.search.index import SearchIndex, SearchOptions


class IndexCache:
    """At most `max_entries` built indexes, thread-safe. Two threads asking for the same missing
    id build it once: the second waits for the first."""

    def __init__(self, max_entries: int = 64, options: SearchOptions | None = None) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._max = max_entries
        self._options = options
        self._indexes: OrderedDict[str, SearchIndex] = OrderedDict()
        self._lock = threading.Lock()
        self._building: dict[str, threading.Lock] = {}

    def __len__(self) -> int:
        return len(self._indexes)

    def __contains__(self, toolset_id: str) -> bool:
        return toolset_id in self._indexes

    def get(self, toolset_id: str) -> SearchIndex | None:
        with self._lock:
            index = self._indexes.get(toolset_id)
            if index is not None:
                self._indexes.move_to_end(toolset_id)
            return index

    def get_or_build(self, toolset_id: str, tools: Callable[[], Sequence[ToolInfo]]) -> SearchIndex:
        """The index of a toolset, built from `tools()` (called only on a miss) and kept."""
        index = self.get(toolset_id)
        if index is not None:
            return index
        with self._lock:
            build_lock = self._building.setdefault(toolset_id, threading.Lock())
        with build_lock:
            index = self.get(toolset_id)
            if index is None:
                index = SearchIndex.build(tools(), self._options)
                with self._lock:
                    self._indexes[toolset_id] = index
                    while len(self._indexes) > self._max:
                        self._indexes.popitem(last=False)
            with self._lock:
                self._building.pop(toolset_id, None)
        return index
