"""Search accuracy on the two labelled corpora: the 112 tools of six npm MCP servers (github,
filesystem, memory, everything, playwright, notion) and 1,350 tools (Twilio's REST API as MCP
tools, from the `@twilio-alpha/mcp` npm package, plus those 112). Each corpus is searched with its
labelled tasks as the queries, and with the first search an agent sends for each task after
reading the namespace catalogue (tests/registry/search/*_agent_queries.json), unscoped and scoped. Floors
sit below the figures `bench/search.py` prints, with headroom; a corpus whose npm package cannot
be had is skipped on a developer's machine and fails in CI (`CI` set: `.ci/run` installs npm).
Vectors are cached across runs (tests/registry/search/support.py).
"""

from __future__ import annotations

import pytest
from toolbus_registry.search import Embedder, SearchIndex

from tests.registry.search.k8s_corpus import load_k8s_corpus
from tests.registry.search.labelled import (
    Accuracy,
    LabelledQuery,
    evaluate,
    load_agent_queries,
    load_k8s_tasks,
    load_queries,
    load_tools,
    load_twilio_tasks,
)
from tests.registry.search.openapi_corpus import load_large_corpus
from tests.registry.search.support import cached_embedder, embedded_index, searcher
from tests.support.gates import missing

# The first run on a machine embeds the 1,350 tools (~15 s on 2 idle cores, minutes on a busy
# one); later runs read the vectors from .cache/search-vectors/.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return cached_embedder()


@pytest.fixture(scope="module")
def small(embedder: Embedder) -> SearchIndex:
    try:
        tools = load_tools()
    except LookupError as exc:
        missing(f"npm MCP catalogues unavailable: {exc}")
    return embedded_index(tools, embedder)


@pytest.fixture(scope="module")
def large(embedder: Embedder) -> SearchIndex:
    try:
        tools = load_large_corpus()
    except LookupError as exc:
        missing(f"Twilio's API description (npm @twilio-alpha/mcp) unavailable: {exc}")
    return embedded_index(tools, embedder)


@pytest.fixture(scope="module")
def k8s(embedder: Embedder) -> SearchIndex:
    try:
        tools = load_k8s_corpus()
    except LookupError as exc:
        missing(f"Kubernetes' API description (PyPI kubernetes) unavailable: {exc}")
    return embedded_index(tools, embedder)


def run(index: SearchIndex, embedder: Embedder, queries: object, dense: bool = True) -> Accuracy:
    return evaluate(searcher(index, embedder, dense=dense), queries)  # type: ignore[arg-type]


def test_labelled_sets_are_over_tools_that_exist(small: SearchIndex, large: SearchIndex) -> None:
    for index, queries, at_least in ((small, load_queries(), 100), (large, load_twilio_tasks(), 150)):
        known = {t.name for t in index.tools}
        assert len(queries) >= at_least
        assert sorted(name for q in queries for name in q.accept if name not in known) == []
    assert len(large) >= 1000


def test_small_corpus_reaches_the_accuracy_floor(small: SearchIndex, embedder: Embedder) -> None:
    # Measured: top-1 0.931 (108 of 116), recall@5 1.000 (0.897 / 1.000 on the even-indexed half
    # the re-ranker and the request verbs were fitted on, 0.966 / 1.000 on the odd half; 0.922 /
    # 1.000 before "remember" asked for a create, 0.914 / 0.991 before the re-ranker).
    accuracy = run(small, embedder, load_queries())
    assert accuracy.top1 >= 0.92, accuracy.misses
    assert accuracy.recall5 >= 0.99, accuracy.misses


def test_large_corpus_reaches_the_accuracy_floor(large: SearchIndex, embedder: Embedder) -> None:
    # Measured: top-1 0.506, recall@5 0.758 on 178 tasks (0.506 / 0.753 on the even-indexed half
    # the re-ranker's weights were fitted on, 0.506 / 0.764 on the held-out odd half; 0.478 /
    # 0.742 before it; plain BM25 0.225 / 0.455). The issue's targets (0.75 / 0.92) are not
    # reached: see docs/design.md.
    accuracy = run(large, embedder, load_twilio_tasks())
    assert accuracy.top1 >= 0.49, accuracy.misses
    assert accuracy.recall5 >= 0.74, accuracy.misses


def test_lexical_search_alone_reaches_its_floor(small: SearchIndex, embedder: Embedder) -> None:
    accuracy = run(small, embedder, load_queries(), dense=False)
    assert accuracy.top1 >= 0.75, accuracy.misses
    assert accuracy.recall5 >= 0.93, accuracy.misses


def test_close_an_issue_is_not_a_browser_close(small: SearchIndex, embedder: Embedder) -> None:
    for dense in (False, True):
        assert searcher(small, embedder, dense=dense)("close an issue", 1) == ["github.update_issue"], dense


def run_agent(index: SearchIndex, embedder: Embedder, corpus: str, *, scoped: bool) -> Accuracy:
    """The agent's queries of `corpus` on `index`, scoped to the namespaces it chose or not."""
    agent = load_agent_queries(corpus)
    keyed = [LabelledQuery(str(i), a.task.accept, False) for i, a in enumerate(agent)]

    def search(key: str, k: int) -> list[str]:
        a = agent[int(key)]
        within = index.within(a.namespaces) if scoped else None
        hits = index.search(a.query, k, query_vector=embedder.encode_query(a.query), within=within)
        return [r.tool.name for r in hits]

    return evaluate(search, keyed)


def test_agent_queries_scope_only_namespaces_that_exist(
    small: SearchIndex, large: SearchIndex, k8s: SearchIndex
) -> None:
    for index, corpus in ((small, "small"), (large, "large"), (k8s, "k8s")):
        namespaces = {t.name.partition(".")[0] for t in index.tools}
        assert (
            sorted(n for a in load_agent_queries(corpus) for n in a.namespaces if n not in namespaces) == []
        )


def test_large_corpus_agent_queries_reach_the_accuracy_floor(large: SearchIndex, embedder: Embedder) -> None:
    # Measured (in-process, same ranking as through NATS): unscoped 0.927 / 0.983, scoped 0.961 /
    # 0.994 on 178 tasks; the issue's targets are 0.90 / 0.98 unscoped, 0.95 / 0.99 scoped.
    unscoped = run_agent(large, embedder, "large", scoped=False)
    assert unscoped.top1 >= 0.91, unscoped.misses
    assert unscoped.recall5 >= 0.97, unscoped.misses
    scoped = run_agent(large, embedder, "large", scoped=True)
    assert scoped.top1 >= 0.95, scoped.misses
    assert scoped.recall5 >= 0.99, scoped.misses


def test_small_corpus_agent_queries_reach_the_accuracy_floor(small: SearchIndex, embedder: Embedder) -> None:
    # Measured: unscoped 0.966 / 0.991, scoped 0.991 / 1.000 on 116 tasks.
    unscoped = run_agent(small, embedder, "small", scoped=False)
    assert unscoped.top1 >= 0.95, unscoped.misses
    assert unscoped.recall5 >= 0.98, unscoped.misses
    scoped = run_agent(small, embedder, "small", scoped=True)
    assert scoped.top1 >= 0.97, scoped.misses
    assert scoped.recall5 >= 0.99, scoped.misses


def test_k8s_labelled_set_is_over_tools_that_exist(k8s: SearchIndex) -> None:
    known = {t.name for t in k8s.tools}
    assert len(k8s) >= 1000 and len(load_k8s_tasks()) >= 120
    assert sorted(name for q in load_k8s_tasks() for name in q.accept if name not in known) == []


def test_k8s_corpus_reaches_the_accuracy_floors(k8s: SearchIndex, embedder: Embedder) -> None:
    # Measured: the task as the query 0.566 / 0.770 (lexical alone 0.328 / 0.598); the agent's
    # query unscoped 0.943 / 0.992, scoped 0.959 / 1.000 (122 tasks). Misses of the agent's query:
    # `list namespaced pod` ranks `list_pod_for_all_namespaces` above `list_namespaced_pod`.
    task = run(k8s, embedder, load_k8s_tasks())
    assert task.top1 >= 0.55, task.misses
    assert task.recall5 >= 0.75, task.misses
    unscoped = run_agent(k8s, embedder, "k8s", scoped=False)
    assert unscoped.top1 >= 0.93, unscoped.misses
    assert unscoped.recall5 >= 0.98, unscoped.misses
    scoped = run_agent(k8s, embedder, "k8s", scoped=True)
    assert scoped.top1 >= 0.95, scoped.misses
    assert scoped.recall5 >= 0.99, scoped.misses
