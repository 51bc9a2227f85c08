"""Tool search through NATS on two labelled corpora, beside plain BM25 over the same tool texts.

    uv run python bench/search.py [--rounds 2] [--corpus small|large|k8s|both|all] [--registry-python PY]

Corpora: `small`, the 112 tools of six npm MCP servers with 116 labelled queries
(tests/registry/search/queries.json); `large`, Twilio's REST API as 1,239 MCP tools (from the
`@twilio-alpha/mcp` npm package) plus those 112, with 178 labelled tasks
(tests/registry/search/twilio_tasks.json); `k8s`, Kubernetes' API as 999 MCP tools (from the
`kubernetes` PyPI client) plus those 112, with 122 labelled tasks (tests/registry/search/k8s_tasks.json).
Each corpus's servers are served by real MCP servers over streamable HTTP; a registry runs as its own process (`python -m toolbus_registry`, from
`--registry-python`: point it at another checkout's venv to measure that code) on a fresh subject
prefix against NATS at TOOLBUS_NATS_URL (default 127.0.0.1:4222); its buckets are deleted after.

Printed per corpus, each beside plain BM25 over the same query: top-1 and recall@5 of three query
sets, the labelled task as the query, the agent's query (tests/registry/search/*_agent_queries.json: what
a model sends after reading the namespace catalogue) unscoped, and the agent's query scoped to the
namespaces it chose; p50 and p99 of `toolsets.search` through NATS (warm: the last of `--rounds`
passes) and of `toolsets.namespaces`, registration time of a toolset not seen before, the registry's CPU time per
search in that pass (from /proc: steadier than latency on a loaded machine), the first search
right after it (lexical while the tools are embedded in the background), how long the background
embedding took, then the same registration and first search after a registry restart (vectors
read back from the KV bucket), and the registry's RSS. The baseline is plain BM25 (Okapi, k1 1.2,
b 0.75: no fields, stemming or synonyms) over the same words, in-process, in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nats
from toolbus_contracts import ToolInfo
from toolbus_devstack import free_port
from toolbus_devstack.services import ServiceProcess, start_service, stop_process
from toolbus_registry.search.lexical import Bm25Params, Field, LexicalIndex
from toolbus_registry.search.text import split_identifier

from bench.harness import percentile
from tests.registry.search.k8s_corpus import load_k8s_corpus
from tests.registry.search.labelled import (
    AgentQuery,
    LabelledQuery,
    evaluate,
    load_agent_queries,
    load_k8s_tasks,
    load_queries,
    load_tools,
    load_twilio_tasks,
)
from tests.registry.search.openapi_corpus import load_large_corpus
from tests.support.mcp_servers import McpTestServer

NATS_URL = os.environ.get("TOOLBUS_NATS_URL", "nats://127.0.0.1:4222")
REDIS_URL = os.environ.get("TOOLBUS_REDIS_URL", "redis://127.0.0.1:6379/0")


class PlainBm25:
    """The baseline: Okapi BM25 over one bag of words per tool (name split, description,
    parameter names), lowercased, nothing else."""

    def __init__(self, tools: Sequence[ToolInfo]) -> None:
        self.tools = list(tools)
        docs = []
        for t in tools:
            params = " ".join((t.input_schema.get("properties") or {}).keys())
            docs.append({"all": split_identifier(f"{t.name} {t.description} {params}")})
        self.index = LexicalIndex(docs, Bm25Params(fields={"all": Field(weight=1.0, b=0.75)}))

    def search(self, query: str, k: int, namespaces: Sequence[str] | None = None) -> list[str]:
        """The best `k` tool names, of `namespaces` only when given."""
        groups = [{w: 1.0} for w in dict.fromkeys(split_identifier(query))]
        scores = self.index.scores(groups, coordination=0.0)
        ids = [
            i
            for i in range(len(self.tools))
            if namespaces is None or self.tools[i].name.partition(".")[0] in namespaces
        ]
        order = sorted(ids, key=lambda i: (-float(scores[i]), self.tools[i].name))
        return [self.tools[i].name for i in order[:k] if scores[i] > 0]


QuerySet = list[tuple[str, LabelledQuery, tuple[str, ...] | None]]
"""(query sent, its labelled task, the namespaces it is scoped to or None), in the tasks' order."""


def query_sets(queries: list[LabelledQuery], agent: list[AgentQuery]) -> dict[str, QuerySet]:
    """The three ways one task is searched: the task as the query, the agent's query unscoped,
    the agent's query scoped."""
    return {
        "task": [(q.query, q, None) for q in queries],
        "agent": [(a.query, a.task, None) for a in agent],
        "scoped": [(a.query, a.task, a.namespaces) for a in agent],
    }


def score(results: Sequence[Sequence[str]], sets: QuerySet) -> Any:
    """Accuracy of `results` (names per query, in `sets` order) against the labelled tasks."""
    keyed = [LabelledQuery(f"{i}:{q}", task.accept, False) for i, (q, task, _) in enumerate(sets)]
    by_key = {k.query: list(r) for k, r in zip(keyed, results, strict=True)}
    return evaluate(lambda q, k: by_key[q][:k], keyed)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process, MiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metric(base_url: str, name: str) -> float | None:
    try:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=2) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


async def tear_down(nc: Any, prefix: str, servers: Sequence[McpTestServer]) -> None:
    """After a bench's registry run: stop the corpus's MCP servers, delete the JetStream streams
    the registry made under `prefix`, close the connection."""
    await asyncio.gather(*(s.stop() for s in servers))
    js = nc.jetstream()
    for info in await js.streams_info():
        if prefix.upper() in info.config.name.upper():
            await js.delete_stream(info.config.name)
    await nc.close()


def start_registry(env: dict[str, str], python: str | None) -> ServiceProcess:
    """A ready registry, run by `python` (another checkout's venv) when given. Such a registry binds
    a free port itself: code older than `TOOLBUS_HTTP_FD` would bind the port of a handed-down
    socket a second time and fail."""
    return start_service("registry", env, python=python, port=free_port() if python else None)


def registry_env(prefix: str) -> dict[str, str]:
    """The environment of a registry process serving on a subject prefix of its own."""
    return {
        "TOOLBUS_NATS_URL": NATS_URL,
        "TOOLBUS_REDIS_URL": REDIS_URL,
        "TOOLBUS_SUBJECT_PREFIX": prefix,
        "TOOLBUS_LOG_LEVEL": "WARNING",
    }


def create_body(servers: Sequence[McpTestServer]) -> bytes:
    """A `toolsets.create` body registering every one of `servers`."""
    return json.dumps({"mcp": [{"name": s.name, "url": s.url} for s in servers]}).encode()


async def serve(tools: Sequence[ToolInfo]) -> list[McpTestServer]:
    by_server: dict[str, list[dict[str, Any]]] = {}
    for t in tools:
        server, _, local = t.name.partition(".")
        by_server.setdefault(server, []).append(
            {"name": local, "description": t.description, "inputSchema": t.input_schema}
        )
    servers = [McpTestServer(ts, name=name) for name, ts in by_server.items()]
    await asyncio.gather(*(s.start() for s in servers))
    return servers


async def bench_corpus(
    label: str,
    tools: list[ToolInfo],
    queries: list[LabelledQuery],
    agent: list[AgentQuery],
    rounds: int,
    python: str | None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"corpus": label, "tools": len(tools), "queries": len(queries)}
    bm25 = PlainBm25(tools)
    sets = query_sets(queries, agent)
    lat = []
    for q in queries:
        t0 = time.perf_counter()
        bm25.search(q.query, 5)
        lat.append(time.perf_counter() - t0)
    out["bm25"] = {"p50": percentile(lat, 0.5), "p99": percentile(lat, 0.99)}
    for name, qs in sets.items():
        acc = score([bm25.search(q, 5, scope) for q, _, scope in qs], qs)
        out["bm25"][name] = {"top1": acc.top1, "recall5": acc.recall5}

    servers = await serve(tools)
    prefix = f"tbbench{uuid.uuid4().hex[:8]}"
    env = registry_env(prefix)
    body = create_body(servers)
    nc = await nats.connect(NATS_URL)

    async def ask(subject: str, payload: bytes, wait: float = 60) -> dict[str, Any]:
        reply: dict[str, Any] = json.loads(
            (await nc.request(f"{prefix}.{subject}", payload, timeout=wait)).data
        )
        if not reply.get("ok"):
            raise RuntimeError(reply)
        return reply["data"]  # type: ignore[no-any-return]

    async def serves_scopes(toolset_id: str, query: str) -> bool:
        """Whether the registry takes `namespaces` (one from before it refuses the field)."""
        namespace = tools[0].name.partition(".")[0]
        body_ = {"id": toolset_id, "query": query, "limit": 1, "namespaces": [namespace]}
        try:
            await ask("toolsets.search", json.dumps(body_).encode())
        except RuntimeError:
            return False
        return True

    async def register_and_first_search() -> tuple[str, float, float]:
        t0 = time.perf_counter()
        created = await ask("toolsets.create", body)
        registered = time.perf_counter() - t0
        q = json.dumps({"id": created["id"], "query": queries[0].query, "limit": 5}).encode()
        t0 = time.perf_counter()
        await ask("toolsets.search", q)
        return created["id"], registered, time.perf_counter() - t0

    async def wait_embedded(base_url: str) -> float:
        t0 = time.perf_counter()
        await asyncio.sleep(0.2)
        while metric(base_url, "toolbus_search_toolsets_embedding") not in (0.0, None):  # noqa: ASYNC110 - polls another process
            await asyncio.sleep(0.1)
        return time.perf_counter() - t0

    try:
        registry = start_registry(env, python)
        try:
            idle = rss_mib(registry.proc.pid)
            toolset_id, registered, first = await register_and_first_search()
            # The agent's queries sent right after registration, one after another, while the
            # tools are embedded in the background: what quality a fresh toolset gets, and when.
            began = time.perf_counter() - first
            early: list[list[str]] = []
            rankings: dict[str, int] = {}
            for sent, _task, _scope in sets["agent"]:
                payload = json.dumps({"id": toolset_id, "query": sent, "limit": 5}).encode()
                data = await ask("toolsets.search", payload)
                early.append([t["name"] for t in data["tools"]])
                ranking = str(data.get("ranking"))
                rankings[ranking] = rankings.get(ranking, 0) + 1
            early_time = time.perf_counter() - began
            early_acc = score(early, sets["agent"])
            embedded = await wait_embedded(registry.base_url) + early_time
            out["cold"] = {
                "register": registered,
                "first_search": first,
                "embedding": embedded,
                "encoded": metric(registry.base_url, "toolbus_search_texts_encoded_total"),
                "on_demand": metric(registry.base_url, "toolbus_search_tools_embedded_on_demand_total"),
                "early": {
                    "top1": early_acc.top1,
                    "recall5": early_acc.recall5,
                    "seconds": early_time,
                    "rankings": rankings,
                },
            }

            out["toolbus"] = {}
            for name, qs in sets.items():
                if name == "scoped" and not await serves_scopes(toolset_id, qs[0][0]):
                    continue  # a registry from before scoped search (--registry-python)
                results: list[list[str]] = []
                lat = []
                cpu = 0.0
                for _ in range(rounds):
                    results, lat = [], []
                    cpu = cpu_seconds(registry.proc.pid)
                    for sent, _task, scope in qs:
                        body_: dict[str, Any] = {"id": toolset_id, "query": sent, "limit": 5}
                        if scope is not None:
                            body_["namespaces"] = list(scope)
                        t0 = time.perf_counter()
                        data = await ask("toolsets.search", json.dumps(body_).encode())
                        lat.append(time.perf_counter() - t0)
                        results.append([t["name"] for t in data["tools"]])
                    cpu = (cpu_seconds(registry.proc.pid) - cpu) / len(qs)
                acc = score(results, qs)
                out["toolbus"][name] = {
                    "top1": acc.top1,
                    "recall5": acc.recall5,
                    "p50": percentile(lat, 0.5),
                    "p99": percentile(lat, 0.99),
                    "cpu": cpu,
                    "misses": acc.misses,
                }
            lat = []
            for _ in range(50):
                t0 = time.perf_counter()
                try:
                    await ask("toolsets.namespaces", json.dumps({"id": toolset_id}).encode(), 5)
                except Exception:  # not served by a registry from before it (--registry-python)
                    break
                lat.append(time.perf_counter() - t0)
            if lat:
                out["namespaces"] = {"p50": percentile(lat, 0.5), "p99": percentile(lat, 0.99)}
            out["rss"] = {
                "idle": idle[0],
                "after": rss_mib(registry.proc.pid)[0],
                "peak": rss_mib(registry.proc.pid)[1],
            }
        finally:
            stop_process(registry.proc)
        registry = start_registry(env, python)
        try:
            _, registered, first = await register_and_first_search()
            embedded = await wait_embedded(registry.base_url)
            out["restart"] = {
                "register": registered,
                "first_search": first,
                "embedding": embedded,
                "encoded": metric(registry.base_url, "toolbus_search_texts_encoded_total"),
                "loaded": metric(registry.base_url, "toolbus_search_texts_loaded_total"),
            }
            out["rss"]["restart_peak"] = rss_mib(registry.proc.pid)[1]
        finally:
            stop_process(registry.proc)
    finally:
        await tear_down(nc, prefix, servers)
    return out


def report(results: list[dict[str, Any]]) -> None:
    def row(what: str, get: Callable[[dict[str, Any]], str]) -> None:
        print(f"| {what} | " + " | ".join(get(r) for r in results) + " |")

    print(
        "\n| | "
        + " | ".join(f"{r['corpus']} ({r['tools']} tools, {r['queries']} tasks)" for r in results)
        + " |"
    )
    print("|---|" + "---|" * len(results))
    for name, what in (
        ("task", "the task as the query"),
        ("agent", "agent's query, unscoped"),
        ("scoped", "agent's query, scoped"),
    ):
        row(
            f"{what}: top-1 / recall@5, toolbus (plain BM25)",
            lambda r, n=name: (  # type: ignore[misc]
                (
                    f"{r['toolbus'][n]['top1']:.3f} / {r['toolbus'][n]['recall5']:.3f} "
                    if n in r["toolbus"]
                    else "not served "
                )
                + f"({r['bm25'][n]['top1']:.3f} / {r['bm25'][n]['recall5']:.3f})"
            ),
        )
        row(
            f"{what}: p50 / p99 (NATS)",
            lambda r, n=name: (  # type: ignore[misc]
                f"{ms(r['toolbus'][n]['p50'])} / {ms(r['toolbus'][n]['p99'])}" if n in r["toolbus"] else "-"
            ),
        )
    row(
        "plain BM25 p50 / p99 (in-process, task as query)",
        lambda r: f"{ms(r['bm25']['p50'])} / {ms(r['bm25']['p99'])}",
    )
    row(
        "toolsets.namespaces p50 / p99 (NATS)",
        lambda r: (
            f"{ms(r['namespaces']['p50'])} / {ms(r['namespaces']['p99'])}"
            if "namespaces" in r
            else "not served"
        ),
    )
    row("registry CPU per search (warm round, task as query)", lambda r: ms(r["toolbus"]["task"]["cpu"]))
    row("registration, toolset not seen before", lambda r: ms(r["cold"]["register"]))
    row("first search after it", lambda r: ms(r["cold"]["first_search"]))
    row(
        "agent's queries (unscoped) right after registration: top-1 / recall@5",
        lambda r: f"{r['cold']['early']['top1']:.3f} / {r['cold']['early']['recall5']:.3f}",
    )
    row(
        "... all sent within (s), rankings",
        lambda r: (
            f"{r['cold']['early']['seconds']:.1f} s, "
            + ", ".join(f"{k} {v}" for k, v in sorted(r["cold"]["early"]["rankings"].items()))
        ),
    )
    row("... tools embedded on demand", lambda r: f"{r['cold']['on_demand']}")  # None: before it
    row(
        "background embedding (texts encoded)",
        lambda r: f"{r['cold']['embedding']:.1f} s ({r['cold']['encoded']})",
    )
    row(
        "after a restart: registration / first search",
        lambda r: f"{ms(r['restart']['register'])} / {ms(r['restart']['first_search'])}",
    )
    row(
        "after a restart: texts encoded / loaded",
        lambda r: f"{r['restart']['encoded']} / {r['restart']['loaded']}",
    )
    row(
        "registry RSS idle / after / peak (MiB)",
        lambda r: f"{r['rss']['idle']:.0f} / {r['rss']['after']:.0f} / {r['rss']['peak']:.0f}",
    )
    for r in results:
        for name in ("task", "agent", "scoped"):
            if name not in r["toolbus"]:
                continue
            misses = r["toolbus"][name]["misses"]
            print(f"\n{r['corpus']}, {name}: toolbus misses at top-1 ({len(misses)}):")
            for query, got in misses:
                print(f"    {query!r} -> {', '.join(got)}")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--corpus", choices=("small", "large", "k8s", "both", "all"), default="all")
    parser.add_argument("--registry-python", default=None, help="the Python whose toolbus_registry runs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    if args.corpus in ("small", "both", "all"):
        results.append(
            await bench_corpus(
                "small",
                load_tools(),
                load_queries(),
                load_agent_queries("small"),
                args.rounds,
                args.registry_python,
            )
        )
    if args.corpus in ("large", "both", "all"):
        results.append(
            await bench_corpus(
                "large",
                load_large_corpus(),
                load_twilio_tasks(),
                load_agent_queries("large"),
                args.rounds,
                args.registry_python,
            )
        )
    if args.corpus in ("k8s", "all"):
        results.append(
            await bench_corpus(
                "k8s",
                load_k8s_corpus(),
                load_k8s_tasks(),
                load_agent_queries("k8s"),
                args.rounds,
                args.registry_python,
            )
        )
    if args.json:
        print(json.dumps(results, default=str))
    report(results)


if __name__ == "__main__":
    asyncio.run(main())
