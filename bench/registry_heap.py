"""Where a running registry's memory goes after a corpus: a `python -m toolbus_registry` process
registers the corpus's servers, embeds them, answers every labelled task twice, then writes its
`/proc/self/smaps_rollup` (anonymous vs file-backed) and, with `--trace`, tracemalloc's top
holders by file and by line (the registry started under tracemalloc: RSS and CPU are inflated).

    uv run python bench/registry_heap.py [--corpus large|small] [--trace] [--registry-python PY]

`--registry-python` runs another checkout's registry (its venv's Python), as in bench/search.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nats
from toolbus_devstack import free_port
from toolbus_devstack.services import start_service, stop_process

from bench.search import (
    NATS_URL,
    cpu_seconds,
    create_body,
    metric,
    registry_env,
    rss_mib,
    serve,
    tear_down,
)
from tests.registry.search.labelled import evaluate, load_queries, load_tools, load_twilio_tasks
from tests.registry.search.openapi_corpus import load_large_corpus

WRAPPER = r"""
import os, runpy, signal, sys, tracemalloc, gc
TRACE = os.environ.get("HEAP_TRACE") == "1"
if TRACE:
    tracemalloc.start()
def short(name):
    return name.split("site-packages/")[-1].split("/src/")[-1]
def dump(*_):
    gc.collect()
    out = [open("/proc/self/smaps_rollup").read()]
    if TRACE:
        snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        out.append("Python-allocated %.1f MiB" % (sum(s.size for s in snap.statistics("filename")) / 2**20))
        for key, n in (("filename", 20), ("lineno", 30)):
            out.append("== by " + key)
            for s in snap.statistics(key)[:n]:
                f = s.traceback[0]
                at = short(f.filename) + (":%d" % f.lineno if key == "lineno" else "")
                out.append("%8.2f MiB %7d  %s" % (s.size / 2**20, s.count, at))
    with open(os.environ["HEAP_OUT"], "w") as fh:
        fh.write("\n".join(out) + "\n")
signal.signal(signal.SIGUSR1, dump)
sys.argv = ["toolbus_registry"]
runpy.run_module("toolbus_registry", run_name="__main__", alter_sys=True)
"""


async def run(corpus: str, trace: bool, python: str) -> None:
    tools, queries = (
        (load_large_corpus(), load_twilio_tasks()) if corpus == "large" else (load_tools(), load_queries())
    )
    servers = await serve(tools)
    prefix = f"tbheap{uuid.uuid4().hex[:8]}"
    nc = await nats.connect(NATS_URL)
    work = Path(tempfile.mkdtemp(prefix="registry-heap-"))
    (work / "wrapper.py").write_text(WRAPPER)
    launcher = work / "python"
    launcher.write_text(f'#!/bin/sh\nexec "{python}" "{work / "wrapper.py"}"\n')
    launcher.chmod(0o755)
    out = work / "heap.txt"
    env = {**registry_env(prefix), "HEAP_TRACE": "1" if trace else "0", "HEAP_OUT": str(out)}

    async def ask(subject: str, payload: bytes) -> dict[str, object]:
        reply = json.loads((await nc.request(f"{prefix}.{subject}", payload, timeout=60)).data)
        if not reply.get("ok"):
            raise RuntimeError(reply)
        return reply["data"]  # type: ignore[no-any-return]

    try:
        # Another checkout's registry binds a free port itself (see bench.search.start_registry).
        port = free_port() if python != sys.executable else None
        registry = start_service("registry", env, python=str(launcher), port=port)
        pid = registry.proc.pid
        try:
            print(f"RSS idle {rss_mib(pid)[0]:.1f} MiB")
            t0 = time.perf_counter()
            created = await ask("toolsets.create", create_body(servers))
            print(f"registration {time.perf_counter() - t0:.3f} s")
            await asyncio.sleep(0.3)
            t0 = time.perf_counter()
            while metric(registry.base_url, "toolbus_search_toolsets_embedding") not in (0.0, None):  # noqa: ASYNC110 - polls another process
                await asyncio.sleep(0.2)
            print(f"embedded in {time.perf_counter() - t0:.1f} s, RSS {rss_mib(pid)[0]:.1f} MiB")
            names: dict[str, list[str]] = {}
            for _ in range(2):
                cpu = cpu_seconds(pid)
                for q in queries:
                    body = json.dumps({"id": created["id"], "query": q.query, "limit": 5}).encode()
                    data = await ask("toolsets.search", body)
                    names[q.query] = [t["name"] for t in data["tools"]]  # type: ignore[index, attr-defined]
                print(f"registry CPU per search {(cpu_seconds(pid) - cpu) / len(queries) * 1000:.1f} ms")
            acc = evaluate(lambda q, k: names[q][:k], queries)
            rss, peak = rss_mib(pid)
            print(
                f"top-1 {acc.top1:.3f} recall@5 {acc.recall5:.3f}; RSS after {rss:.1f} MiB, peak {peak:.1f} MiB"
            )
            os.kill(pid, signal.SIGUSR1)
            for _ in range(600):
                if out.exists() and out.stat().st_size:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)
            print(out.read_text())
        finally:
            stop_process(registry.proc)
    finally:
        await tear_down(nc, prefix, servers)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", choices=("large", "small"), default="large")
    parser.add_argument("--trace", action="store_true", help="run the registry under tracemalloc")
    parser.add_argument("--registry-python", default=sys.executable)
    args = parser.parse_args()
    asyncio.run(run(args.corpus, args.trace, args.registry_python))
