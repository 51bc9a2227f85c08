"""Search over the tools of one toolset: BM25F and dense retrieval, fused, the head re-ranked.

`SearchIndex.build(tools)` does the lexical part only (milliseconds per thousand tools), so a
toolset is searchable as soon as it is registered. Its tools' vectors (two a tool: its text and
its name's words; computed in the background by the registry's `Embedder`, from a persisted store
when they were embedded before) are attached later with `attach`; from then on every search ranks
every tool by cosine similarity to the query as well, fused with the lexical ranking by reciprocal
rank fusion, and re-ranks the fused head with a linear model over the head's features
(`head_features`, weighted by `RerankWeights`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from toolbus_contracts import ToolInfo

from toolbus_registry.search.encoder import Vectors
from toolbus_registry.search.lexical import Bm25Params, LexicalIndex
from toolbus_registry.search.text import (
    ACTIONS,
    expand,
    request_action,
    resource_words,
    split_identifier,
    terms,
    tool_action,
)


@dataclass(frozen=True)
class RerankWeights:
    """The linear re-ranker of the fused head: a head tool's score is the sum of these weights
    times its features (`SearchIndex.head_features`, same order as the fields). Fitted on the
    even-indexed tasks of both labelled corpora only (tests/registry/search; the odd half held out):
    `bench/search_fit.py` fits a listwise logistic regression (softmax over each task's head,
    standardised features, L2 0.03, numpy gradient descent), scales it so that `cosine` is 1, then
    moves each weight by ±0.05 and ±0.02 while the even half's top-1 + recall@5 / 2 (summed over
    both corpora) rises; the weights are that result, rounded."""

    cosine: float = 1.0
    """Cosine of the query with the tool's text (namespace, name words, description)."""
    lexical: float = 0.36
    """BM25F score over the query's best BM25F score."""
    name_cosine: float = 0.36
    """Cosine of the query with the tool's name words alone (a second vector per tool)."""
    fused: float = 0.25
    """Reciprocal-rank-fusion score over the best one."""
    action: float = 0.07
    """1 when the tool's verb is the action the request asks for (`text.request_action`)."""
    other_action: float = -0.09
    """1 when the request asks for an action and the tool's verb is another one."""
    namespace_match: float = 0.12
    """1 when a word of the tool's namespace (version tokens and words most namespaces share
    left out) is among the query's terms or their synonyms."""
    unasked_resource: float = -0.21
    """Words of the tool's resource (its name without the verb) that the query does not mention
    (synonyms count), over 4, at most 1: `CreateMessageFeedback` for "send a text"."""
    namespace_cosine: float = 0.21
    """Cosine of the query with the mean vector of the tool's namespace."""
    namespace_top3: float = 0.44
    """Mean cosine of the query with the three closest tools of the tool's namespace: a query
    about conversations lifts every tool of the namespace that holds them."""

    def vector(self) -> npt.NDArray[np.float32]:
        """The weights in `FEATURES` order."""
        return np.asarray([getattr(self, name) for name in FEATURES], dtype=np.float32)


FEATURES: tuple[str, ...] = tuple(f.name for f in fields(RerankWeights))
"""Names of the head features, in `RerankWeights.vector()` order."""


@dataclass(frozen=True)
class SearchOptions:
    """How a search ranks. The defaults are the ones measured by `bench/search.py`."""

    rrf_k: int = 60
    """Reciprocal rank fusion constant: a tool scores 1/(k + rank) in each ranking it is in."""
    head: int = 40
    """Tools taken from the top of the fused ranking and re-ranked by `rerank`."""
    synonym_weight: float = 0.35
    coordination: float = 1.0
    """Exponent of the share of query words a tool matches, multiplied into its BM25F score."""
    rerank: RerankWeights = field(default_factory=RerankWeights)
    params_text_chars: int = 2000
    """Parameter text (names and descriptions) indexed per tool, at most."""
    bm25: Bm25Params = field(default_factory=Bm25Params)


class _Partial(NamedTuple):
    """Vectors of the tools embedded so far (zero rows for the others)."""

    vectors: Vectors
    name_vectors: Vectors
    centroids: Vectors
    has: npt.NDArray[np.bool_]


class ScoredTool(NamedTuple):
    tool: ToolInfo
    score: float


def split_qualified_name(name: str) -> tuple[str, str]:
    """`"github.list_issues" -> ("github", "list_issues")`; a name with no dot has no namespace."""
    namespace, dot, local = name.rpartition(".")
    return (namespace, local) if dot else ("", name)


def scope_name(name: str) -> str:
    """The namespace a search scopes a tool by: its name up to the first dot (the MCP server, the
    host group, `http`, `workflows`), or the whole name of a host tool with no group."""
    return name.partition(".")[0]


def field_texts(name: str, description: str, params: str) -> dict[str, str]:
    """The text each BM25F field of a tool is made of (`DEFAULT_FIELDS`): what `SearchIndex.build`
    indexes and `PreparedTerms` works out ahead. `params`: the tool's `_schema_text`."""
    namespace, local = split_qualified_name(name)
    return {"name": local, "server": namespace, "description": description, "params": params}


def _schema_text(schema: Mapping[str, Any], limit: int) -> str:
    """Names and descriptions of the parameters of a JSON schema, nested objects included."""
    parts: list[str] = []
    size = 0

    def walk(node: dict[str, Any], depth: int) -> None:
        # Schemas are parsed JSON, so nodes are dicts: `isinstance(x, dict)` instead of the ABC
        # `Mapping` check, and children checked before descending. This walk was a third of
        # `SearchIndex.build` (docs/design.md, "Search index build").
        nonlocal size
        description = node.get("description")
        if depth and isinstance(description, str):
            parts.append(description)
            size += len(description) + 1
        # Enumerated values say what a tool can do: `state: open|closed` is how an issue is closed.
        enum = node.get("enum")
        if isinstance(enum, list):
            text = " ".join(v for v in enum if isinstance(v, str))
            parts.append(text)
            size += len(text) + 1
        props = node.get("properties")
        if isinstance(props, dict):
            for key, sub in props.items():
                if size > limit:
                    return
                key = str(key)
                parts.append(key)
                size += len(key) + 1
                if depth < 4 and isinstance(sub, dict):
                    walk(sub, depth + 1)
        if depth == 4:
            return
        for key in ("items", "additionalProperties"):
            sub = node.get(key)
            if isinstance(sub, dict) and size <= limit:
                walk(sub, depth + 1)
        for key in ("anyOf", "oneOf", "allOf"):
            alternatives = node.get(key)
            if isinstance(alternatives, list):
                for sub in alternatives:
                    if isinstance(sub, dict) and size <= limit:
                        walk(sub, depth + 1)

    # Text past the limit is cut off below, so a walk stops adding once past it.
    if isinstance(schema, dict):
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


def name_text(tool: ToolInfo) -> str:
    """What the encoder reads for a tool's second vector: the words of its own name."""
    return " ".join(split_identifier(split_qualified_name(tool.name)[1]))


_VERSION = re.compile(r"(v\d*|\d+)")


def namespace_terms(namespaces: Sequence[str]) -> dict[str, frozenset[str]]:
    """{namespace: its search terms}, without version tokens (`v`, `2010`) and, where there are
    4+ namespaces, without the words more than half of them share (`twilio` of `twilio_api_v2010`):
    what is left tells one namespace from another."""
    words = {
        ns: frozenset(terms(" ".join(w for w in split_identifier(ns) if not _VERSION.fullmatch(w))))
        for ns in set(namespaces)
    }
    if len(words) >= 4:
        counts: dict[str, int] = {}
        for ws in words.values():
            for w in ws:
                counts[w] = counts.get(w, 0) + 1
        common = {w for w, c in counts.items() if c * 2 > len(words)}
        words = {ns: ws - common for ns, ws in words.items()}
    return words


class PreparedTerms:
    """The search terms of tools' texts, worked out before their toolset's index is built: a
    registration hands each server's tools here as it is listed (`add`, in a worker thread, while
    other servers are still being listed), and `SearchIndex.build` then finds them done. Tools
    are named as in the index (qualified names); a tool's texts are its name's and namespace's
    words, its description and its parameters' text, as `build` reads them. Once closed (the
    listing is over, or the build started), what is still to be added is skipped: the build does
    it itself."""

    def __init__(self, options: SearchOptions | None = None) -> None:
        self.params_text_chars = (options or SearchOptions()).params_text_chars
        self.known: dict[str, list[str]] = {}
        """Text -> its terms."""
        self.params_texts: dict[str, str] = {}
        """Qualified tool name -> its parameters' text."""
        self._closed = False

    def add(self, tools: Sequence[tuple[str, str, Mapping[str, Any]]]) -> None:
        """(qualified name, description, input schema) of tools: their texts' terms."""
        known = self.known
        for name, description, schema in tools:
            if self._closed:
                return
            params = _schema_text(schema, self.params_text_chars)
            self.params_texts[name] = params
            for text in field_texts(name, description, params).values():
                if text not in known:
                    known[text] = terms(text)

    def close(self) -> None:
        self._closed = True


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
        self.name_texts: tuple[str, ...] = tuple(name_text(t) for t in self.tools)
        """The words of each tool's own name: its second vector (`name_cosine`)."""
        self._vectors: Vectors | None = None
        self._name_vectors: Vectors | None = None
        self._centroids: Vectors | None = None
        self._partial: _Partial | None = None
        """Vectors of some tools (zero rows for the others), while the toolset is being embedded:
        swapped whole on each `attach_some`, so a search reads one consistent state."""
        locals_ = [split_qualified_name(t.name) for t in self.tools]
        actions = [tool_action(local) for _, local in locals_]
        self._actions = {a: np.asarray([x == a for x in actions], dtype=np.float32) for a in ACTIONS}
        self._has_action = np.asarray([x is not None for x in actions], dtype=np.float32)
        self._resources = tuple(frozenset(terms(" ".join(resource_words(local)))) for _, local in locals_)
        namespaces = sorted({ns for ns, _ in locals_})
        self._namespace_terms = namespace_terms(namespaces)
        self._namespaces = namespaces
        position = {ns: k for k, ns in enumerate(namespaces)}
        self._namespace_of = np.asarray([position[ns] for ns, _ in locals_], dtype=np.intp)
        self._members = [np.flatnonzero(self._namespace_of == k) for k in range(len(namespaces))]
        scopes: dict[str, list[int]] = {}
        for i, tool in enumerate(self.tools):
            scopes.setdefault(scope_name(tool.name), []).append(i)
        self._scopes = {name: np.asarray(ids, dtype=np.intp) for name, ids in scopes.items()}

    @classmethod
    def build(
        cls,
        tools: Sequence[ToolInfo],
        options: SearchOptions | None = None,
        prepared: PreparedTerms | None = None,
    ) -> SearchIndex:
        """Index the tools lexically (milliseconds per thousand tools); `attach` adds vectors.
        `prepared`: terms of these tools' texts worked out ahead (`PreparedTerms`), used as found."""
        options = options or SearchOptions()
        if prepared is not None:
            prepared.close()
        # Terms of each distinct text once: namespaces repeat on every tool of a server, and
        # many tools share their parameters' text (the same schema on every tool of an API).
        known = prepared.known if prepared is not None else {}
        # Parameters' texts prepared with another length limit are not these: made again.
        same = prepared is not None and prepared.params_text_chars == options.params_text_chars
        params_texts = prepared.params_texts if prepared is not None and same else {}

        def terms_of(text: str) -> list[str]:
            found = known.get(text)
            if found is None:
                found = known[text] = terms(text)
            return found

        docs = []
        for tool in tools:
            params = params_texts.get(tool.name)
            if params is None:
                params = _schema_text(tool.input_schema, options.params_text_chars)
            texts = field_texts(tool.name, tool.description, params)
            docs.append({field: terms_of(text) for field, text in texts.items()})
        lexical = LexicalIndex(docs, options.bm25)
        return cls(tools, lexical, options)

    def __len__(self) -> int:
        return len(self.tools)

    @property
    def dense(self) -> bool:
        """Whether the tools' vectors are attached (until then searches are lexical)."""
        return self._vectors is not None

    @property
    def embedding_texts(self) -> tuple[str, ...]:
        """Every text the tools' vectors are made of: `texts`, then `name_texts`."""
        return self.texts + self.name_texts

    def attach(self, vectors: Vectors) -> None:
        """Attach the unit vectors of `embedding_texts`, shape (2 * len(tools), dim)."""
        n = len(self.tools)
        if vectors.shape[0] != 2 * n:
            raise ValueError(f"{vectors.shape[0]} vectors for {n} tools (two a tool)")
        vectors = np.asarray(vectors, dtype=np.float32)
        self._name_vectors = np.ascontiguousarray(vectors[n:])
        self._centroids = self._centroids_of(vectors[:n])
        self._vectors = np.ascontiguousarray(vectors[:n])  # last: `dense` turns true with all set
        self._partial = None

    @property
    def embedded(self) -> int:
        """Tools whose vectors are attached (all of them once `dense`)."""
        if self._vectors is not None:
            return len(self.tools)
        partial = self._partial
        return int(partial.has.sum()) if partial is not None else 0

    def missing(self, ids: npt.NDArray[np.intp]) -> npt.NDArray[np.intp]:
        """Those of `ids` whose vectors are not attached yet."""
        if self._vectors is not None:
            return ids[:0]
        partial = self._partial
        return ids if partial is None else ids[~partial.has[ids]]

    def texts_of(self, ids: npt.NDArray[np.intp]) -> list[str]:
        """What the vectors of these tools are made of: their texts, then their name texts (the
        form `attach_some` takes)."""
        order = ids.tolist()
        return [self.texts[i] for i in order] + [self.name_texts[i] for i in order]

    def attach_some(self, ids: npt.NDArray[np.intp], vectors: Vectors) -> None:
        """Attach the vectors of some tools (`texts_of(ids)`, shape (2 * len(ids), dim)) while the
        toolset is still being embedded: searches use them (`search`'s partial ranking)."""
        k = ids.size
        if vectors.shape[0] != 2 * k:
            raise ValueError(f"{vectors.shape[0]} vectors for {k} tools (two a tool)")
        if self._vectors is not None or k == 0:
            return
        n, dim = len(self.tools), vectors.shape[1]
        old = self._partial
        texts = old.vectors.copy() if old is not None else np.zeros((n, dim), dtype=np.float32)
        names = old.name_vectors.copy() if old is not None else np.zeros((n, dim), dtype=np.float32)
        has = old.has.copy() if old is not None else np.zeros(n, dtype=bool)
        texts[ids] = vectors[:k]
        names[ids] = vectors[k:]
        has[ids] = True
        self._partial = _Partial(texts, names, self._centroids_of(texts), has)

    def _centroids_of(self, vectors: Vectors) -> Vectors:
        centroids = np.zeros((len(self._namespaces), vectors.shape[1]), dtype=np.float32)
        np.add.at(centroids, self._namespace_of, vectors)
        centroids /= np.maximum(np.linalg.norm(centroids, axis=1, keepdims=True), 1e-12)
        return centroids

    def lexical_top(
        self, query: str, k: int, within: npt.NDArray[np.intp] | None = None
    ) -> npt.NDArray[np.intp]:
        """The ids of the `k` best tools by BM25F (of `within` only when given), best first."""
        lex = self.lexical_scores(query)
        ids = np.flatnonzero(lex > 0) if within is None else within[lex[within] > 0]
        return self._top_ids(lex, ids, k)

    def lexical_scores(self, query: str) -> npt.NDArray[np.float32]:
        """BM25F score of every tool for the query, synonyms included."""
        groups = expand(terms(query), self.options.synonym_weight)
        return self._lexical.scores(groups, self.options.coordination)

    def within(self, namespaces: Sequence[str]) -> npt.NDArray[np.intp]:
        """The ids of the tools of these namespaces (`scope_name`), ascending; unknown names
        add nothing."""
        found = [self._scopes[ns] for ns in dict.fromkeys(namespaces) if ns in self._scopes]
        if not found:
            return np.zeros(0, dtype=np.intp)
        return np.sort(np.concatenate(found))

    def search(
        self,
        query: str,
        limit: int = 5,
        *,
        query_vector: Vectors | None = None,
        within: npt.NDArray[np.intp] | None = None,
    ) -> list[ScoredTool]:
        """The best `limit` tools for a natural-language query, best first, ties by name.

        Without vectors (none attached, or no `query_vector`): lexical only, and tools that share
        no term with the query are left out. With some (`attach_some`: the toolset is still being
        embedded), as with all, tools without vectors scoring a cosine of 0 (the caller attaches
        those of the lexical head first). With all: the dense ranking of every tool (cosine)
        and the lexical ranking are fused by reciprocal rank fusion; the fused head is re-ranked
        by the linear model `options.rerank` over `head_features`, which is the score.
        `within`: only these tool ids (`within(namespaces)`) are ranked and returned.
        """
        if limit < 1 or not self.tools or (within is not None and within.size == 0):
            return []
        if query_vector is None or (self._vectors is None and self._partial is None):
            groups = expand(terms(query), self.options.synonym_weight)
            lex = self._lexical.scores(groups, self.options.coordination)
            ids = np.flatnonzero(lex > 0) if within is None else within[lex[within] > 0]
            return self._top(lex, ids, limit)
        head, features = self.head_features(query, query_vector, max(self.options.head, limit), within)
        scores = np.zeros(len(self.tools), dtype=np.float32)
        scores[head] = features @ self.options.rerank.vector()
        return self._top(scores, head, limit)

    def head_features(
        self,
        query: str,
        query_vector: Vectors,
        head_size: int | None = None,
        within: npt.NDArray[np.intp] | None = None,
    ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float32]]:
        """The fused head (tool ids, best fused first) and its features, one row per head tool,
        columns as `FEATURES`. Needs the vectors attached. `within`: both rankings are of these
        tool ids only (a scoped search), so the head is too."""
        vectors, name_vectors, centroids = self._vectors, self._name_vectors, self._centroids
        partial = self._partial
        if (vectors is None or name_vectors is None or centroids is None) and partial is not None:
            vectors, name_vectors, centroids = partial.vectors, partial.name_vectors, partial.centroids
        if vectors is None or name_vectors is None or centroids is None:
            raise ValueError("no vectors attached")
        opts = self.options
        query_terms = terms(query)
        groups = expand(query_terms, opts.synonym_weight)
        lex = self._lexical.scores(groups, opts.coordination)
        n = len(self.tools)
        q = query_vector.astype(np.float32)
        cosine = vectors @ q
        ranks = np.arange(1, n + 1, dtype=np.float32)
        fused = np.zeros(n, dtype=np.float32)
        ids = np.arange(n) if within is None else within
        fused[ids[np.argsort(-cosine[ids], kind="stable")]] += 1.0 / (opts.rrf_k + ranks[: ids.size])
        matched = ids[lex[ids] > 0]
        if matched.size:
            by_lex = matched[np.argsort(-lex[matched], kind="stable")]
            fused[by_lex] += 1.0 / (opts.rrf_k + ranks[: by_lex.size])
        head = self._top_ids(fused, ids, head_size or opts.head)
        asked = {t for group in groups for t in group}
        features = np.zeros((head.size, len(FEATURES)), dtype=np.float32)
        best = float(lex[ids].max())
        features[:, 0] = cosine[head]
        features[:, 1] = lex[head] / best if best > 0 else 0.0
        features[:, 2] = name_vectors[head] @ q
        features[:, 3] = fused[head] / float(fused.max())
        action = request_action(query)
        if action is not None:
            features[:, 4] = self._actions[action][head]
            features[:, 5] = self._has_action[head] - features[:, 4]
        spaces = self._namespace_of[head]
        features[:, 6] = [bool(self._namespace_terms[self._namespaces[k]] & asked) for k in spaces]
        features[:, 7] = [min(len(self._resources[i] - asked), 4) / 4.0 for i in head.tolist()]
        features[:, 8] = (centroids @ q)[spaces]
        top3 = {k: float(np.sort(cosine[self._members[k]])[-3:].mean()) for k in set(spaces.tolist())}
        features[:, 9] = [top3[k] for k in spaces.tolist()]
        return head, features

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
