"""Indexes with their vectors attached, for the accuracy tests and `bench/search.py`.

Vectors are read from and written to `.cache/search-vectors/<model>.npz` (a `FileVectorStore`),
so embedding a corpus is paid once per machine, not on every test run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from toolbus_contracts import ToolInfo
from toolbus_registry.search import Embedder, FileVectorStore, SearchIndex, SearchOptions, default_encoder
from toolbus_registry.search.encoder import MODEL_ID

from tests.registry.search.labelled import ROOT

VECTOR_CACHE = ROOT / ".cache" / "search-vectors" / f"{MODEL_ID}.npz"


def cached_embedder() -> Embedder:
    return Embedder(default_encoder, FileVectorStore(VECTOR_CACHE))


def embedded_index(
    tools: Sequence[ToolInfo], embedder: Embedder, options: SearchOptions | None = None
) -> SearchIndex:
    """The index of `tools` with every tool's vector attached."""
    index = SearchIndex.build(tools, options)
    index.attach(asyncio.run(embedder.embed(index.embedding_texts)))
    return index


def searcher(
    index: SearchIndex, embedder: Embedder, *, dense: bool = True
) -> Callable[[str, int], list[str]]:
    """`(query, k) -> names` over the index: fused (dense) or lexical only."""

    def search(query: str, k: int) -> list[str]:
        vector = embedder.encode_query(query) if dense else None
        return [r.tool.name for r in index.search(query, k, query_vector=vector)]

    return search
