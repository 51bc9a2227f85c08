"""SearchIndex ranking (lexical alone, and fused with dense retrieval), the embedder with its
persisted store, shared description openings, and the contract's hits."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from toolbus_contracts import EffectivePolicy, ToolInfo
from toolbus_registry.search import (
    Embedder,
    Encoder,
    FileVectorStore,
    PreparedTerms,
    SearchIndex,
    SearchOptions,
    default_encoder,
    text_key,
    to_hits,
)
from toolbus_registry.search.encoder import Vectors
from toolbus_registry.search.index import (
    FEATURES,
    RerankWeights,
    namespace_terms,
    shared_description_prefixes,
)


def tool(name: str, description: str = "", properties: dict[str, Any] | None = None) -> ToolInfo:
    return ToolInfo(
        name=name,
        kind="mcp",
        description=description,
        input_schema={"type": "object", "properties": properties or {}},
        policy=EffectivePolicy.for_kind("mcp", None),
    )


TOOLS = [
    tool(
        "github.update_issue",
        "Update an existing issue in a GitHub repository",
        {"issue_number": {"type": "number"}, "state": {"type": "string", "enum": ["open", "closed"]}},
    ),
    tool("github.create_issue", "Create a new issue in a GitHub repository", {"title": {"type": "string"}}),
    tool("github.list_issues", "List issues in a GitHub repository with filtering options"),
    tool("playwright.browser_close", "Close the page"),
    tool("playwright.browser_navigate", "Navigate to a URL", {"url": {"type": "string"}}),
    tool("filesystem.create_directory", "Create a new directory or ensure a directory exists."),
    tool("filesystem.move_file", "Move or rename files and directories."),
    tool("everything.get-sum", "Returns the sum of two numbers", {"a": {"type": "number"}}),
]


def names(results: Sequence[Any]) -> list[str]:
    return [r.tool.name for r in results]


def dense(tools: Sequence[ToolInfo], embedder: Embedder | None = None) -> tuple[SearchIndex, Embedder]:
    embedder = embedder or Embedder(default_encoder)
    index = SearchIndex.build(tools)
    index.attach(asyncio.run(embedder.embed(index.embedding_texts)))
    return index, embedder


def fused(index: SearchIndex, embedder: Embedder, query: str, limit: int) -> list[str]:
    return names(index.search(query, limit, query_vector=embedder.encode_query(query)))


def test_lexical_search_matches_split_stemmed_names_and_synonyms() -> None:
    index = SearchIndex.build(TOOLS)
    assert not index.dense
    assert names(index.search("make a new folder", 1)) == ["filesystem.create_directory"]
    assert names(index.search("listing issues", 1)) == ["github.list_issues"]
    # Tools that share no term with the query are left out of lexical results.
    assert names(index.search("zebra", 5)) == []


def test_close_an_issue_ranks_the_issue_tool_above_a_browser_close_lexically() -> None:
    # `state: open|closed` is indexed, and the issue tool matches both query words where the
    # browser's close matches one. (Fused with dense retrieval this is measured on the real catalogues.)
    index = SearchIndex.build(TOOLS)
    results = names(index.search("close an issue", 3))
    assert results[0] == "github.update_issue"
    assert "playwright.browser_close" in results


def test_dense_retrieval_finds_a_tool_that_shares_no_word_with_the_query() -> None:
    index, embedder = dense(TOOLS)
    assert index.dense
    assert fused(index, embedder, "add 2 and 3 together", 1) == ["everything.get-sum"]
    assert fused(index, embedder, "open example.com", 1) == ["playwright.browser_navigate"]


def test_dense_retrieval_ranks_every_tool_of_a_large_toolset() -> None:
    # Every tool is ranked, not only lexical survivors: no tool shares a word with this query.
    codes = [f"{chr(97 + i % 26)}{chr(97 + i // 26)}" for i in range(80)]
    filler = [tool(f"filler.widget_{c}", f"Frobnicate the widget {c}") for c in codes]
    index, embedder = dense(TOOLS + filler)
    assert not index.search("compute 7 + 11", 3)  # nothing lexical
    assert fused(index, embedder, "compute 7 + 11", 3)[0] == "everything.get-sum"


def test_results_are_best_first_limited_and_scored() -> None:
    index, embedder = dense(TOOLS)
    results = index.search("issue", 2, query_vector=embedder.encode_query("issue"))
    assert len(results) == 2
    assert results[0].score >= results[1].score
    assert all(r.tool.name.startswith("github.") for r in results)
    assert index.search("issue", 0) == []
    assert SearchIndex.build([]).search("issue", 5) == []


def test_attach_refuses_vectors_of_another_size() -> None:
    index, embedder = dense(TOOLS)
    other = SearchIndex.build(TOOLS[:3])
    with pytest.raises(ValueError, match="16 vectors for 3 tools"):
        other.attach(asyncio.run(embedder.embed(index.embedding_texts)))


def test_descriptions_lose_the_opening_their_whole_namespace_shares() -> None:
    boiler = "Twilio - Api: This is the public Twilio REST API. "
    api = [
        tool(f"api.op{i}", boiler + text)
        for i, text in enumerate(["Send a message", "Fetch a call", "Buy a number"])
    ]
    assert shared_description_prefixes(api + TOOLS) == {"api": boiler}
    index = SearchIndex.build(api + TOOLS)
    assert index.texts[0] == "api op 0: Send a message"
    # Namespaces with varied openings, or too few tools, keep their descriptions whole.
    assert index.texts[len(api)] == "github update issue: Update an existing issue in a GitHub repository"


class CountingEncoder(Encoder):
    """The real encoder, counting the texts it is asked to encode."""

    def __init__(self, inner: Encoder) -> None:
        self.__dict__.update(inner.__dict__)
        self.encoded = 0

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> Vectors:
        self.encoded += len(texts)
        return super().encode(texts, batch_size)


def test_embedder_encodes_each_text_once_and_reuses_a_persisted_store(tmp_path: Path) -> None:
    counting = CountingEncoder(default_encoder())
    store = FileVectorStore(tmp_path / "vectors.npz")
    embedder = Embedder(lambda: counting, store, max_entries=6)
    texts = list(SearchIndex.build(TOOLS).texts)
    first = asyncio.run(embedder.embed(texts[:4]))
    again = asyncio.run(embedder.embed(texts[:4]))
    assert counting.encoded == 4 and embedder.encoded == 4
    assert (first == again).all()
    asyncio.run(embedder.embed(texts))
    assert counting.encoded == 8

    # Another process (a restart, a replica) over the same store encodes nothing.
    fresh = Embedder(lambda: counting, FileVectorStore(tmp_path / "vectors.npz"))
    vectors = asyncio.run(fresh.embed(texts))
    assert fresh.encoded == 0 and fresh.loaded == len(texts)
    assert abs(vectors - asyncio.run(embedder.embed(texts))).max() < 1e-2  # stored as float16


def test_to_hits_carries_prompt_and_dts_from_the_declarations_functions() -> None:
    index = SearchIndex.build(TOOLS)
    hits = to_hits(
        index.search("move a file", 2),
        prompt_line=lambda t: f"{t.name}: {t.description}",
        dts_fragment=lambda t: f"declare function {t.name.replace('.', '_')}(): void;",
    )
    assert hits[0].name == "filesystem.move_file"
    assert hits[0].prompt == "filesystem.move_file: Move or rename files and directories."
    assert hits[0].dts == "declare function filesystem_move_file(): void;"
    assert set(hits[0].wire()) == {"name", "namespace", "prompt", "dts", "score"}


def test_the_action_asked_for_lifts_its_tool_over_a_near_twin() -> None:
    twins = [
        tool("api.CreateVerification", "Create a new Verification using a Service"),
        tool("api.UpdateVerification", "Update a Verification status"),
    ]
    index, embedder = dense(twins)
    query = "cancel a pending verification"
    vector = embedder.encode_query(query)
    no_action = RerankWeights(action=0.0, other_action=0.0)
    plain = SearchIndex.build(twins, SearchOptions(rerank=no_action))
    plain.attach(asyncio.run(embedder.embed(plain.embedding_texts)))
    with_bonus = index.search(query, 2, query_vector=vector)
    without = plain.search(query, 2, query_vector=vector)
    assert names(with_bonus)[0] == "api.UpdateVerification"
    bonus = {r.tool.name: r.score for r in with_bonus}
    base = {r.tool.name: r.score for r in without}
    weights = RerankWeights()
    assert abs(bonus["api.UpdateVerification"] - base["api.UpdateVerification"] - weights.action) < 1e-4
    assert abs(bonus["api.CreateVerification"] - base["api.CreateVerification"] - weights.other_action) < 1e-4


def test_head_features_are_the_reranked_score() -> None:
    index, embedder = dense(TOOLS)
    query = "close an issue"
    vector = embedder.encode_query(query)
    head, features = index.head_features(query, vector)
    assert features.shape == (len(TOOLS), len(FEATURES))  # a head larger than the toolset: all
    by_name = {index.tools[i].name: row for i, row in zip(head.tolist(), features, strict=True)}
    update = dict(zip(FEATURES, by_name["github.update_issue"].tolist(), strict=True))
    # Its namespace is not asked for, its resource (issue) is, and the request asks for an update.
    assert update["namespace_match"] == 0.0 and update["unasked_resource"] == 0.0
    assert update["action"] == 1.0 and update["other_action"] == 0.0
    create = dict(zip(FEATURES, by_name["github.create_issue"].tolist(), strict=True))
    assert create["action"] == 0.0 and create["other_action"] == 1.0
    browser = dict(zip(FEATURES, by_name["playwright.browser_close"].tolist(), strict=True))
    assert browser["unasked_resource"] == 0.25  # "browser" is not asked for, "close" is
    scores = {r.tool.name: r.score for r in index.search(query, len(TOOLS), query_vector=vector)}
    weights = RerankWeights().vector()
    for name, row in by_name.items():
        assert abs(scores[name] - float(row @ weights)) < 1e-5


def test_namespace_terms_leave_out_versions_and_words_most_namespaces_share() -> None:
    spaces = ["twilio_api_v2010", "twilio_chat_v2", "twilio_voice_v1", "twilio_conversations_v1", "github"]
    words = namespace_terms(spaces)
    assert words["twilio_api_v2010"] == {"api"}
    assert words["twilio_conversations_v1"] == {"convers"}
    assert words["github"] == {"github"}
    # Too few namespaces to tell what is shared: only the version tokens go.
    assert namespace_terms(["twilio_api_v2010", "twilio_chat_v2"])["twilio_chat_v2"] == {"twilio", "chat"}


def test_the_embedders_memory_holds_float16_copies_not_rows_of_the_arrays_it_returned() -> None:
    # A row of a returned array would keep the whole array (an index's) alive: the memory keeps
    # each vector's float16 bytes instead, exact since the vectors are rounded to float16.
    embedder = Embedder(default_encoder)
    texts = list(SearchIndex.build(TOOLS).texts)
    vectors = asyncio.run(embedder.embed(texts + texts[:1]))
    assert not vectors.flags.writeable
    encoded = embedder.encoded
    again = asyncio.run(embedder.embed(texts))
    assert embedder.encoded == encoded  # all from memory
    assert np.array_equal(again, vectors[: len(texts)])
    for row, text in enumerate(texts):
        remembered = embedder._memory.get(text_key(text))
        assert isinstance(remembered, bytes) and len(remembered) == 2 * vectors.shape[1]
        assert np.array_equal(np.frombuffer(remembered, dtype=np.float16).astype(np.float32), vectors[row])
    cached = embedder.cached(texts)
    assert cached is not None and np.array_equal(cached, again)
    # What an index let go of is freed, whatever the memory still remembers.
    returned = weakref.ref(vectors)
    del vectors
    assert returned() is None


def test_an_index_built_from_prepared_terms_is_the_one_built_without() -> None:
    # A registration prepares its tools' terms while servers are listed (`PreparedTerms.add`),
    # some of them only (the listing ended first): the build finds those and does the rest.
    prepared = PreparedTerms()
    prepared.add([(t.name, t.description, t.input_schema) for t in TOOLS[:5]])
    assert prepared.known and len(prepared.params_texts) == 5
    with_terms = SearchIndex.build(TOOLS, prepared=prepared)
    prepared.add([(t.name, t.description, t.input_schema) for t in TOOLS[5:]])  # closed by the build
    assert len(prepared.params_texts) == 5
    plain = SearchIndex.build(TOOLS)
    for query in ("close an issue", "create a folder", "add two numbers", "open a web page"):
        a, b = with_terms.search(query, 8), plain.search(query, 8)
        assert names(a) == names(b) and [r.score for r in a] == [r.score for r in b], query
