"""Search over the tools of one toolset: BM25F candidates, re-ranked by a sentence encoder.

`SearchIndex.build(tools)` does the lexical part only (milliseconds per thousand tools). A search
with `rerank=True` fuses the normalised BM25F score with the cosine similarity between the query
and each candidate tool under all-MiniLM-L6-v2. Candidates are the lexical top `candidates`; on
toolsets of at most `dense_all_max` tools they are every tool, so a query that shares no word with
the right tool still finds it. Tool embeddings come from a process-wide cache keyed by content
hash, so each tool is encoded once; `warm()` encodes them ahead of the first search.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from toolbus_contracts import ToolInfo

from toolbus_registry.search.embeddings import EmbeddingCache
from toolbus_registry.search.encoder import Encoder, Vectors, default_encoder
from toolbus_registry.search.lexical import Bm25Params, LexicalIndex
from toolbus_registry.search.text import expand, split_identifier, terms


@dataclass(frozen=True)
class SearchOptions:
    """How a search ranks. The defaults are the ones measured by `bench/search.py`."""

    candidates: int = 40
    """Lexical top-K that the encoder re-ranks on toolsets larger than `dense_all_max`."""
    dense_all_max: int = 1000
    """Toolsets up to this size are scored densely over every tool (all embedded once)."""
    synonym_weight: float = 0.35
    coordination: float = 1.0
    """Exponent of the share of query words a tool matches, multiplied into its BM25F score."""
    dense_weight: float = 1.0
    lexical_weight: float = 0.3
    """Weight of the BM25F score divided by the best BM25F score of the query."""
    params_text_chars: int = 2000
    """Parameter text (names and descriptions) indexed per tool, at most."""
    bm25: Bm25Params = field(default_factory=Bm25Params)


class ScoredTool(NamedTuple):
    tool: ToolInfo
    score: float


_default_cache: EmbeddingCache | None = None
_default_cache_lock = threading.Lock()


def default_embedding_cache() -> EmbeddingCache:
    """The process-wide tool-embedding cache over the bundled encoder."""
    global _default_cache
    if _default_cache is None:
        with _default_cache_lock:
            if _default_cache is None:
                _default_cache = EmbeddingCache(default_encoder)
    return _default_cache


def split_qualified_name(name: str) -> tuple[str, str]:
    """`"github.list_issues" -> ("github", "list_issues")`; a name with no dot has no namespace."""
    namespace, dot, local = name.rpartition(".")
    return (namespace, local) if dot else ("", name)


def _schema_text(schema: Mapping[str, Any], limit: int) -> str:
    """Names and descriptions of the parameters of a JSON schema, nested objects included."""
    parts: list[str] = []
    size = 0

    def add(text: str) -> None:
        nonlocal size
        parts.append(text)
        size += len(text) + 1

    def walk(node: Any, depth: int) -> None:
        if size > limit or depth > 4 or not isinstance(node, Mapping):
            return
        if isinstance(node.get("description"), str) and depth > 0:
            add(node["description"])
        # Enumerated values say what a tool can do: `state: open|closed` is how an issue is closed.
        enum = node.get("enum")
        if isinstance(enum, list):
            add(" ".join(v for v in enum if isinstance(v, str)))
        props = node.get("properties")
        if isinstance(props, Mapping):
            for key, sub in props.items():
                add(str(key))
                walk(sub, depth + 1)
        for key in ("items", "additionalProperties"):
            walk(node.get(key), depth + 1)
        for key in ("anyOf", "oneOf", "allOf"):
            alternatives = node.get(key)
            if isinstance(alternatives, list):
                for sub in alternatives:
                    walk(sub, depth + 1)

    walk(schema, 0)
    return " ".join(parts)[:limit]


def embedding_text(tool: ToolInfo) -> str:
    """What the encoder reads for a tool: its namespace and name as words, then its description.
    (Adding parameter names and enum values was measured: recall@5 rose, top-1 fell, and encoding
    took longer, so parameters stay lexical-only.)"""
    namespace, local = split_qualified_name(tool.name)
    words = " ".join(split_identifier(local))
    head = f"{' '.join(split_identifier(namespace))} {words}".strip()
    return f"{head}: {tool.description.strip()}" if tool.description.strip() else head


class SearchIndex:
    """A ranked search over one toolset's tools. Immutable once built; safe to share across threads."""

    def __init__(
        self,
        tools: Sequence[ToolInfo],
        lexical: LexicalIndex,
        options: SearchOptions,
        embeddings: EmbeddingCache | None,
        encoder: Callable[[], Encoder],
    ) -> None:
        self.tools: tuple[ToolInfo, ...] = tuple(tools)
        self.options = options
        self._lexical = lexical
        self._embeddings = embeddings
        self._encoder = encoder
        self._texts = [embedding_text(t) for t in self.tools]
        self._all_vectors: Vectors | None = None
        self._warm_lock = threading.Lock()

    @classmethod
    def build(
        cls,
        tools: Sequence[ToolInfo],
        options: SearchOptions | None = None,
        *,
        embeddings: EmbeddingCache | None = None,
        encoder: Callable[[], Encoder] = default_encoder,
    ) -> SearchIndex:
        """Index the tools lexically. `embeddings` defaults to the process-wide cache."""
        options = options or SearchOptions()
        docs = []
        for tool in tools:
            namespace, local = split_qualified_name(tool.name)
            docs.append(
                {
                    "name": terms(local),
                    "server": terms(namespace),
                    "description": terms(tool.description),
                    "params": terms(_schema_text(tool.input_schema, options.params_text_chars)),
                }
            )
        lexical = LexicalIndex(docs, options.bm25)
        return cls(tools, lexical, options, embeddings, encoder)

    def __len__(self) -> int:
        return len(self.tools)

    def _cache(self) -> EmbeddingCache:
        if self._embeddings is None:
            self._embeddings = default_embedding_cache()
        return self._embeddings

    def warm(self) -> None:
        """Encode every tool now (CPU-bound: about 10 ms a tool on 2 cores, once per tool content)
        so that the first re-ranked search does not pay for it."""
        if self._all_vectors is not None:
            return
        with self._warm_lock:
            if self._all_vectors is None:
                self._all_vectors = self._cache().embed(self._texts)

    def lexical_scores(self, query: str) -> npt.NDArray[np.float32]:
        """BM25F score of every tool for the query, synonyms included."""
        groups = expand(terms(query), self.options.synonym_weight)
        return self._lexical.scores(groups, self.options.coordination)

    def search(self, query: str, limit: int = 5, *, rerank: bool = True) -> list[ScoredTool]:
        """The best `limit` tools for a natural-language query, best first, ties by name.

        Lexical only (`rerank=False`): tools that share no term with the query are left out.
        Re-ranked: scores are `dense_weight * cosine + lexical_weight * bm25 / best_bm25`.
        """
        if limit < 1 or not self.tools:
            return []
        lex = self.lexical_scores(query)
        if not rerank:
            return self._top(lex, np.flatnonzero(lex > 0), limit)
        opts = self.options
        best = float(lex.max())
        lex_norm = lex / best if best > 0 else lex
        query_vec = self._encoder().encode([query])[0]
        if len(self.tools) <= opts.dense_all_max:
            self.warm()
            assert self._all_vectors is not None
            fused = opts.dense_weight * (self._all_vectors @ query_vec) + opts.lexical_weight * lex_norm
            return self._top(fused.astype(np.float32), np.arange(len(self.tools)), limit)
        k = max(opts.candidates, limit)
        candidates = self._top_ids(lex, np.flatnonzero(lex > 0), k)
        if candidates.size == 0:
            return []
        vectors = self._cache().embed([self._texts[i] for i in candidates])
        fused = np.zeros(len(self.tools), dtype=np.float32)
        fused[candidates] = (
            opts.dense_weight * (vectors @ query_vec) + opts.lexical_weight * lex_norm[candidates]
        )
        return self._top(fused, candidates, limit)

    def _top_ids(
        self, scores: npt.NDArray[np.float32], ids: npt.NDArray[np.intp], k: int
    ) -> npt.NDArray[np.intp]:
        if ids.size > k:
            # Keep everything tied with the k-th score so that the name tie-break is exact.
            kth = np.partition(scores[ids], ids.size - k)[ids.size - k]
            ids = ids[scores[ids] >= kth]
        order = sorted(ids.tolist(), key=lambda i: (-float(scores[i]), self.tools[i].name))
        return np.asarray(order[:k], dtype=np.intp)

    def _top(
        self, scores: npt.NDArray[np.float32], ids: npt.NDArray[np.intp], limit: int
    ) -> list[ScoredTool]:
        return [ScoredTool(self.tools[i], float(scores[i])) for i in self._top_ids(scores, ids, limit)]
