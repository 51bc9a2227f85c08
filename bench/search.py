"""Tool search: accuracy on the labelled set over real MCP catalogues, and latency.

    uv run python bench/search.py [--synthetic N]

Prints top-1 and recall@5 lexical-only and re-ranked; p50/p99 search latency on the real
catalogues; index build time, first (cold) and warm search latency on a synthesized N-tool
toolset (default 10,000) made from the real tools renamed across many namespaces.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from toolbus_contracts import ToolInfo
from toolbus_registry.search import EmbeddingCache, SearchIndex, default_encoder

from tests.search.labelled import evaluate, load_queries, load_tools


def pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def timed(fn: object, *args: object, **kwargs: object) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)  # type: ignore[operator]
    return (time.perf_counter() - start) * 1000


def synthesize(tools: list[ToolInfo], n: int) -> list[ToolInfo]:
    out: list[ToolInfo] = []
    i = 0
    while len(out) < n:
        base = tools[len(out) % len(tools)]
        server, _, local = base.name.partition(".")
        out.append(base.model_copy(update={"name": f"{server}{i // len(tools)}.{local}"}))
        i += 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--synthetic", type=int, default=10_000)
    args = parser.parse_args()

    t0 = time.perf_counter()
    default_encoder()
    print(f"model load: {(time.perf_counter() - t0) * 1000:.0f} ms")

    tools = load_tools()
    queries = load_queries()
    t0 = time.perf_counter()
    index = SearchIndex.build(tools)
    build_ms = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    index.warm()
    warm_ms = (time.perf_counter() - t0) * 1000
    print(f"\nreal catalogues: {len(tools)} tools, {len(queries)} labelled queries")
    print(f"  lexical index build {build_ms:.1f} ms; embedding all tools {warm_ms:.0f} ms (once per content)")
    for rerank in (False, True):
        acc = evaluate(lambda q, k, r=rerank: [s.tool.name for s in index.search(q, k, rerank=r)], queries)
        label = "re-ranked   " if rerank else "lexical only"
        print(f"  {label}: top-1 {acc.top1:.1%}  recall@5 {acc.recall5:.1%}")
        for query, got in acc.misses:
            print(f"      miss: {query!r} -> {', '.join(got)}")
    for rerank in (False, True):
        lat = [timed(index.search, q.query, 5, rerank=rerank) for q in queries for _ in range(3)]
        label = "re-ranked   " if rerank else "lexical only"
        print(f"  latency {label}: p50 {pct(lat, 50):.2f} ms  p99 {pct(lat, 99):.2f} ms")

    n = args.synthetic
    big = synthesize(tools, n)
    cache = EmbeddingCache(default_encoder)
    t0 = time.perf_counter()
    big_index = SearchIndex.build(big, embeddings=cache)
    print(f"\nsynthetic toolset: {n} tools (lexical candidates re-ranked: {big_index.options.candidates})")
    print(f"  index build {(time.perf_counter() - t0) * 1000:.0f} ms")
    cold = [timed(big_index.search, q.query, 5) for q in queries[:20]]
    print(
        f"  first searches (candidates not yet embedded): p50 {pct(cold, 50):.0f} ms  max {max(cold):.0f} ms"
    )
    for q in queries:
        big_index.search(q.query, 5)
    for rerank in (False, True):
        lat = [timed(big_index.search, q.query, 5, rerank=rerank) for q in queries for _ in range(3)]
        label = "re-ranked   " if rerank else "lexical only"
        print(f"  warm latency {label}: p50 {pct(lat, 50):.2f} ms  p99 {pct(lat, 99):.2f} ms")
    q_lat = [timed(default_encoder().encode, [q.query]) for q in queries]
    print(f"\nquery embedding alone: p50 {statistics.median(q_lat):.2f} ms")


if __name__ == "__main__":
    main()
