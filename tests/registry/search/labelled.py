"""The labelled query set over real MCP catalogues, and how search is scored against it.

Shared by the accuracy test and `bench/search.py`. Catalogues come from the servers' own
`tools/list` (see `load_tools`); queries from `queries.json` beside this file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolbus_contracts import EffectivePolicy, ToolInfo

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SERVERS = ("everything", "filesystem", "memory", "github", "playwright", "notion")


@dataclass(frozen=True)
class LabelledQuery:
    query: str
    accept: frozenset[str]
    confusable: bool


def load_queries() -> list[LabelledQuery]:
    data = json.loads((HERE / "queries.json").read_text())
    return [
        LabelledQuery(q["query"], frozenset(q["accept"]), bool(q.get("confusable", False)))
        for q in data["queries"]
    ]


def load_twilio_tasks() -> list[LabelledQuery]:
    """The labelled tasks over the large corpus (`openapi_corpus.load_large_corpus`)."""
    data = json.loads((HERE / "twilio_tasks.json").read_text())
    return [LabelledQuery(q["query"], frozenset(q["accept"]), False) for q in data["queries"]]


@dataclass(frozen=True)
class AgentQuery:
    """The first search an agent sends for a labelled task, after reading the catalogue."""

    task: LabelledQuery
    query: str
    namespaces: tuple[str, ...]


def load_k8s_tasks() -> list[LabelledQuery]:
    """The labelled tasks over the Kubernetes corpus (`k8s_corpus.load_k8s_corpus`)."""
    data = json.loads((HERE / "k8s_tasks.json").read_text())
    return [LabelledQuery(q["query"], frozenset(q["accept"]), False) for q in data["queries"]]


def load_agent_queries(corpus: str) -> list[AgentQuery]:
    """The agent-phrased queries beside the labelled tasks of `corpus` (`small`, `large` or
    `k8s`), in the tasks' order: `small_agent_queries.json`, `twilio_agent_queries.json`,
    `k8s_agent_queries.json`."""
    tasks = {"small": load_queries, "large": load_twilio_tasks, "k8s": load_k8s_tasks}[corpus]()
    name = {"small": "small", "large": "twilio", "k8s": "k8s"}[corpus] + "_agent_queries.json"
    data = json.loads((HERE / name).read_text())["queries"]
    if [d["task"] for d in data] != [t.query for t in tasks]:
        raise ValueError(f"{name} is not beside its tasks, one for one, in their order")
    return [AgentQuery(t, d["query"], tuple(d["namespaces"])) for t, d in zip(tasks, data, strict=True)]


def _raw_catalogues() -> Mapping[str, list[dict[str, Any]]]:
    from tests.catalogues.fetch import load_catalogues

    return load_catalogues(list(SERVERS))


def to_tool_info(server: str, tool: Mapping[str, Any]) -> ToolInfo:
    return ToolInfo(
        name=f"{server}.{tool['name']}",
        kind="mcp",
        description=tool.get("description") or "",
        input_schema=tool.get("inputSchema") or {"type": "object"},
        policy=EffectivePolicy.for_kind("mcp", None),
    )


def load_tools() -> list[ToolInfo]:
    """Every tool of the labelled servers, named `<server>.<tool>`. Raises `LookupError` when a
    catalogue cannot be had (no npm and no cache)."""
    catalogues = _raw_catalogues()
    missing = [s for s in SERVERS if s not in catalogues]
    if missing:
        raise LookupError(f"catalogues missing: {', '.join(missing)}")
    return [to_tool_info(s, t) for s in SERVERS for t in catalogues[s]]


@dataclass(frozen=True)
class Accuracy:
    queries: int
    top1: float
    recall5: float
    misses: tuple[tuple[str, tuple[str, ...]], ...]
    """Queries whose first result was not acceptable, with the names ranked first."""


def evaluate(search: Callable[[str, int], Sequence[str]], queries: Sequence[LabelledQuery]) -> Accuracy:
    """Top-1 (first result acceptable) and recall@5 (an acceptable tool among the first five)."""
    top1 = hits5 = 0
    misses = []
    for q in queries:
        names = list(search(q.query, 5))
        if names and names[0] in q.accept:
            top1 += 1
        else:
            misses.append((q.query, tuple(names[:3])))
        if q.accept.intersection(names[:5]):
            hits5 += 1
    n = len(queries)
    return Accuracy(n, top1 / n, hits5 / n, tuple(misses))
