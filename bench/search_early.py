"""Search quality in the first minute after a toolset of 1,000+ new tools is registered.

    uv run python bench/search_early.py [--corpus large|k8s] [--at 1,5,15,30,60]
                                        [--every N] [--registry-python PY] [--baseline-python PY]

For each time t of `--at`, a fresh registry (its own subject prefix and vector bucket, so nothing
is embedded ahead) registers the corpus (`large`: Twilio's REST API plus the six npm servers,
1,350 tools; `k8s`: Kubernetes' API plus those, 1,111 tools), waits until t seconds after the
registration's reply, and sends the agent's queries (tests/search/*_agent_queries.json, unscoped,
one after another, as an agent would). Printed per t: top-1 / recall@5, the seconds the set took
to send (its queries answered from t to t + that), how the replies were ranked (`ranking`), and
`toolsets.get`'s `vectors` before the set. Beside them: the same set once every tool is embedded
(warm) and when `vectors` said so (seconds after the reply). `--baseline-python` runs the same
against another checkout's registry, in rows of its own: before and after in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nats
from tests.search.k8s_corpus import load_k8s_corpus
from tests.search.labelled import AgentQuery, load_agent_queries
from tests.search.openapi_corpus import load_large_corpus
from toolbus_contracts import ToolInfo
from toolbus_devstack.services import stop_process

from bench.search import NATS_URL, create_body, registry_env, score, serve, start_registry
from tests.support.mcp_servers import McpTestServer

FULL_WAIT = 600.0
"""Seconds the warm figure waits, at most, for every tool to be embedded."""


async def checkpoint(
    servers: Sequence[McpTestServer], agent: list[AgentQuery], at: float | None, python: str | None
) -> dict[str, Any]:
    """A fresh registry registers the corpus; `at` seconds after the reply (None: once every
    tool is embedded) the agent's queries are sent. Their accuracy and how they were answered."""
    prefix = f"tbearly{uuid.uuid4().hex[:8]}"
    nc = await nats.connect(NATS_URL)

    async def ask(subject: str, body: dict[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = json.loads(
            (await nc.request(f"{prefix}.{subject}", json.dumps(body).encode(), timeout=60)).data
        )
        if not reply.get("ok"):
            raise RuntimeError(reply)
        return reply["data"]  # type: ignore[no-any-return]

    async def vectors(toolset_id: str) -> tuple[int, int] | None:
        state = (await ask("toolsets.get", {"id": toolset_id})).get("vectors")
        return (state["ready"], state["tools"]) if state else None

    registry = start_registry(registry_env(prefix), python)
    out: dict[str, Any] = {"at": at}
    try:
        created = await ask("toolsets.create", json.loads(create_body(servers)))
        registered = time.perf_counter()
        toolset_id = created["id"]
        if at is None:
            while time.perf_counter() - registered < FULL_WAIT:
                state = await vectors(toolset_id)
                if state is not None and state[0] == state[1]:
                    break
                await asyncio.sleep(0.25)
            out["full_after"] = time.perf_counter() - registered
        else:
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - registered)))
        out["vectors"] = await vectors(toolset_id)
        began = time.perf_counter()
        out["began"] = began - registered
        results: list[list[str]] = []
        rankings: dict[str, int] = {}
        for a in agent:
            data = await ask("toolsets.search", {"id": toolset_id, "query": a.query, "limit": 5})
            results.append([t["name"] for t in data["tools"]])
            ranking = str(data.get("ranking"))
            rankings[ranking] = rankings.get(ranking, 0) + 1
        out["took"] = time.perf_counter() - began
        out["rankings"] = rankings
        acc = score(results, [(a.query, a.task, None) for a in agent])
        out["top1"], out["recall5"] = acc.top1, acc.recall5
    finally:
        stop_process(registry.proc)
        js = nc.jetstream()
        for info in await js.streams_info():
            if prefix.upper() in info.config.name.upper():
                await js.delete_stream(info.config.name)
        await nc.close()
    return out


def row(label: str, r: dict[str, Any]) -> str:
    at = "warm" if r["at"] is None else f"t = {r['at']:g} s"
    vectors = f"{r['vectors'][0]} / {r['vectors'][1]}" if r.get("vectors") else "-"
    rankings = ", ".join(f"{k} {v}" for k, v in sorted(r["rankings"].items()))
    full = f" (all embedded {r['full_after']:.1f} s after the reply)" if "full_after" in r else ""
    return (
        f"| {label} | {at}{full} | {r['top1']:.3f} / {r['recall5']:.3f} | {r['began']:.1f} s + {r['took']:.1f} s "
        f"| {vectors} | {rankings} |"
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", choices=("large", "k8s"), default="large")
    parser.add_argument("--at", default="1,5,15,30,60", help="seconds after registration, comma-separated")
    parser.add_argument(
        "--every", type=int, default=1, help="send every n-th agent query only (a shorter run)"
    )
    parser.add_argument("--registry-python", default=None)
    parser.add_argument("--baseline-python", default=None)
    args = parser.parse_args()
    tools: list[ToolInfo] = load_large_corpus() if args.corpus == "large" else load_k8s_corpus()
    agent = load_agent_queries(args.corpus)[:: args.every]
    registries = [(args.registry_python, "this")]
    if args.baseline_python:
        registries.insert(0, (args.baseline_python, "baseline"))
    servers = await serve(tools)
    print(f"\n{args.corpus}: {len(tools)} tools, {len(agent)} agent queries (unscoped)\n")
    print("| registry | sent at | top-1 / recall@5 | began + took | vectors before | rankings |")
    print("|---|---|---|---|---|---|")
    try:
        for python, label in registries:
            for at in [*(float(x) for x in args.at.split(",")), None]:
                print(row(label, await checkpoint(servers, agent, at, python)), flush=True)
    finally:
        await asyncio.gather(*(s.stop() for s in servers))


if __name__ == "__main__":
    asyncio.run(main())
