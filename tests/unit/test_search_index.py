"""SearchIndex ranking, the large-toolset path, the caches and the contract's hits."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from toolbus_contracts import EffectivePolicy, ToolInfo
from toolbus_registry.search import (
    EmbeddingCache,
    Encoder,
    IndexCache,
    SearchIndex,
    SearchOptions,
    default_encoder,
    to_hits,
)
from toolbus_registry.search.encoder import Vectors
from toolbus_registry.search.index import embedding_text


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


def test_lexical_search_matches_split_stemmed_names_and_synonyms() -> None:
    index = SearchIndex.build(TOOLS)
    assert names(index.search("make a new folder", 1, rerank=False)) == ["filesystem.create_directory"]
    assert names(index.search("listing issues", 1, rerank=False)) == ["github.list_issues"]
    # Tools that share no term with the query are left out of lexical results.
    assert names(index.search("zebra", 5, rerank=False)) == []


def test_close_an_issue_ranks_the_issue_tool_above_a_browser_close_lexically() -> None:
    # `state: open|closed` is indexed, and the issue tool matches both query words where the
    # browser's close matches one. (With the re-ranker this is measured on the real catalogues.)
    index = SearchIndex.build(TOOLS)
    results = names(index.search("close an issue", 3, rerank=False))
    assert results[0] == "github.update_issue"
    assert "playwright.browser_close" in results


def test_rerank_finds_a_tool_that_shares_no_word_with_the_query() -> None:
    index = SearchIndex.build(TOOLS)
    assert names(index.search("add 2 and 3 together", 1)) == ["everything.get-sum"]
    assert names(index.search("open example.com", 1)) == ["playwright.browser_navigate"]


def test_results_are_best_first_limited_and_scored() -> None:
    index = SearchIndex.build(TOOLS)
    results = index.search("issue", 2)
    assert len(results) == 2
    assert results[0].score >= results[1].score
    assert all(r.tool.name.startswith("github.") for r in results)
    assert index.search("issue", 0) == []
    assert SearchIndex.build([]).search("issue", 5) == []


def test_large_toolsets_rerank_only_the_lexical_candidates() -> None:
    filler = [tool(f"filler.widget_{i}", f"Frobnicate widget number {i}") for i in range(60)]
    options = SearchOptions(candidates=5, dense_all_max=10)
    cache = EmbeddingCache(default_encoder)
    index = SearchIndex.build(TOOLS + filler, options, embeddings=cache)
    results = index.search("rename a file", 3)
    assert names(results)[0] == "filesystem.move_file"
    # Only the candidates were embedded, not the 68 tools.
    assert 0 < len(cache) <= options.candidates
    # A query with no lexical match has no candidates on the large path.
    assert index.search("qwertyuiop", 3) == []


class CountingEncoder(Encoder):
    """The real encoder, counting the texts it is asked to encode."""

    def __init__(self, inner: Encoder) -> None:
        self.__dict__.update(inner.__dict__)
        self.encoded = 0

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> Vectors:
        self.encoded += len(texts)
        return super().encode(texts, batch_size)


def test_embedding_cache_encodes_each_tool_text_once_and_stays_bounded() -> None:
    counting = CountingEncoder(default_encoder())
    cache = EmbeddingCache(lambda: counting, max_entries=6)
    texts = [embedding_text(t) for t in TOOLS[:4]]
    first = cache.embed(texts)
    again = cache.embed(texts)
    assert counting.encoded == 4
    assert (first == again).all()
    cache.embed([embedding_text(t) for t in TOOLS[4:]])
    assert len(cache) == 6


def test_index_cache_builds_once_per_toolset_and_evicts_least_recent() -> None:
    cache = IndexCache(max_entries=2)
    calls: list[str] = []

    def loader(tag: str) -> Any:
        def load() -> list[ToolInfo]:
            calls.append(tag)
            return TOOLS

        return load

    threads = [threading.Thread(target=cache.get_or_build, args=("ts_a", loader("a"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["a"]
    first = cache.get_or_build("ts_a", loader("a"))
    assert cache.get_or_build("ts_a", loader("a")) is first
    cache.get_or_build("ts_b", loader("b"))
    cache.get("ts_a")  # a is now the most recent
    cache.get_or_build("ts_c", loader("c"))
    assert "ts_a" in cache
    assert "ts_b" not in cache
    assert len(cache) == 2


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
    assert set(hits[0].wire()) == {"name", "prompt", "dts", "score"}
