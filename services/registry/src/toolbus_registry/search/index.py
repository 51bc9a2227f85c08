"""Search over the tools of one toolset: BM25F and dense retrieval, fused, the head re-ranked.

`SearchIndex.build(tools)` does the lexical part only (milliseconds per thousand tools), so a
toolset is searchable as soon as it is registered. Its tools' vectors (computed in the background
by the registry's `Embedder`, from a persisted store when they were embedded before) are attached
later with `attach`; from then on every search ranks every tool by cosine similarity to the query
as well, fused with the lexical ranking by reciprocal rank fusion, and re-ranks the fused head.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from toolbus_contracts import ToolInfo

from toolbus_registry.search.encoder import Vectors
from toolbus_registry.search.lexical import Bm25Params, LexicalIndex
from toolbus_registry.search.text import ACTIONS, expand, request_action, split_identifier, terms, tool_action


@dataclass(frozen=True)
class SearchOptions:
    """How a search ranks. The defaults are the ones measured by `bench/search.py`."""

    rrf_k: int = 60
    """Reciprocal rank fusion constant: a tool scores 1/(k + rank) in each ranking it is in."""
    head: int = 30
    """Tools taken from the top of the fused ranking and re-ranked by their blended score."""
    synonym_weight: float = 0.35
    coordination: float = 1.0
    """Exponent of the share of query words a tool matches, multiplied into its BM25F score."""
    dense_weight: float = 1.0
    lexical_weight: float = 0.3
    """Weight of the BM25F score divided by the best BM25F score of the query, in the head's
    blended score `dense_weight * cosine + lexical_weight * bm25 / best_bm25`."""
    action_weight: float = 0.04
    """Added to the blended score of a head tool whose name's verb is the action the query asks
    for (`text.request_action`, `text.tool_action`)."""
    params_text_chars: int = 2000
    """Parameter text (names and descriptions) indexed per tool, at most."""
    bm25: Bm25Params = field(default_factory=Bm25Params)


class ScoredTool(NamedTuple):
    tool: ToolInfo
    score: float


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


SHARED_PREFIX_MIN_TOOLS = 3
SHARED_PREFIX_MIN_CHARS = 16


def shared_description_prefixes(tools: Sequence[ToolInfo]) -> dict[str, str]:
    """{namespace: the opening words every description of that namespace shares}, for namespaces
    of at least 3 tools whose shared opening is 16+ characters. Generated API servers open every
    description with the same boilerplate ("Twilio - Api: This is the public Twilio REST API."):
    it tells one tool from another not at all, and it dilutes what the encoder reads."""
    by_namespace: dict[str, list[str]] = {}
    for tool in tools:
        by_namespace.setdefault(split_qualified_name(tool.name)[0], []).append(tool.description)
    out: dict[str, str] = {}
    for namespace, descriptions in by_namespace.items():
        if len(descriptions) < SHARED_PREFIX_MIN_TOOLS:
            continue
        prefix = os.path.commonprefix(descriptions)  # noqa: RUF071 - text, not paths: by character
        cut = prefix.rfind(" ")
        prefix = prefix[: cut + 1] if cut > 0 and not all(d == prefix for d in descriptions) else ""
        if len(prefix) >= SHARED_PREFIX_MIN_CHARS:
            out[namespace] = prefix
    return out


def embedding_text(tool: ToolInfo, shared_prefix: str = "") -> str:
    """What the encoder reads for a tool: its namespace and name as words, then its description
    without the opening its whole namespace shares. (Adding parameter names and enum values was
    measured: recall@5 rose, top-1 fell, and encoding took longer, so parameters stay
    lexical-only.)"""
    namespace, local = split_qualified_name(tool.name)
    words = " ".join(split_identifier(local))
    head = f"{' '.join(split_identifier(namespace))} {words}".strip()
    description = tool.description.strip()
    if shared_prefix and description.startswith(shared_prefix):
        description = description[len(shared_prefix) :].strip()
    return f"{head}: {description}" if description else head


class SearchIndex:
    """A ranked search over one toolset's tools: lexical from the start, dense once the tools'
    vectors are attached. Safe to share across threads (attaching swaps one reference)."""

    def __init__(
        self,
        tools: Sequence[ToolInfo],
        lexical: LexicalIndex,
        options: SearchOptions,
    ) -> None:
        self.tools: tuple[ToolInfo, ...] = tuple(tools)
        self.options = options
        self._lexical = lexical
        prefixes = shared_description_prefixes(self.tools)
        self.texts: tuple[str, ...] = tuple(
            embedding_text(t, prefixes.get(split_qualified_name(t.name)[0], "")) for t in self.tools
        )
        """What the encoder reads for each tool, in `tools` order."""
        self._vectors: Vectors | None = None
        actions = [tool_action(split_qualified_name(t.name)[1]) for t in self.tools]
        self._actions = {a: np.asarray([x == a for x in actions], dtype=np.float32) for a in ACTIONS}

    @classmethod
    def build(cls, tools: Sequence[ToolInfo], options: SearchOptions | None = None) -> SearchIndex:
        """Index the tools lexically (milliseconds per thousand tools); `attach` adds vectors."""
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
        return cls(tools, lexical, options)

    def __len__(self) -> int:
        return len(self.tools)

    @property
    def dense(self) -> bool:
        """Whether the tools' vectors are attached (until then searches are lexical)."""
        return self._vectors is not None

    def attach(self, vectors: Vectors) -> None:
        """Attach the unit vectors of `texts`, shape (len(tools), dim)."""
        if vectors.shape[0] != len(self.tools):
            raise ValueError(f"{vectors.shape[0]} vectors for {len(self.tools)} tools")
        self._vectors = np.ascontiguousarray(vectors, dtype=np.float32)

    def lexical_scores(self, query: str) -> npt.NDArray[np.float32]:
        """BM25F score of every tool for the query, synonyms included."""
        groups = expand(terms(query), self.options.synonym_weight)
        return self._lexical.scores(groups, self.options.coordination)

    def search(self, query: str, limit: int = 5, *, query_vector: Vectors | None = None) -> list[ScoredTool]:
        """The best `limit` tools for a natural-language query, best first, ties by name.

        Without vectors (none attached, or no `query_vector`): lexical only, and tools that share
        no term with the query are left out. With them: the dense ranking of every tool (cosine)
        and the lexical ranking are fused by reciprocal rank fusion; the fused head is re-ranked
        by `dense_weight * cosine + lexical_weight * bm25 / best_bm25`, which is the
        score.
        """
        if limit < 1 or not self.tools:
            return []
        groups = expand(terms(query), self.options.synonym_weight)
        lex = self._lexical.scores(groups, self.options.coordination)
        vectors = self._vectors
        if vectors is None or query_vector is None:
            return self._top(lex, np.flatnonzero(lex > 0), limit)
        opts = self.options
        n = len(self.tools)
        cosine = vectors @ query_vector.astype(np.float32)
        ranks = np.arange(1, n + 1, dtype=np.float32)
        fused = np.zeros(n, dtype=np.float32)
        fused[np.argsort(-cosine, kind="stable")] += 1.0 / (opts.rrf_k + ranks)
        matched = np.flatnonzero(lex > 0)
        if matched.size:
            by_lex = matched[np.argsort(-lex[matched], kind="stable")]
            fused[by_lex] += 1.0 / (opts.rrf_k + ranks[: by_lex.size])
        head = self._top_ids(fused, np.arange(n), max(opts.head, limit))
        best = float(lex.max())
        blended = np.zeros(n, dtype=np.float32)
        blended[head] = opts.dense_weight * cosine[head] + opts.lexical_weight * (
            lex[head] / best if best > 0 else lex[head]
        )
        action = request_action(query)
        if action is not None and opts.action_weight:
            blended[head] += opts.action_weight * self._actions[action][head]
        return self._top(blended, head, limit)

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
