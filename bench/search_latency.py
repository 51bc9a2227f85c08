"""Where a search's time goes in a real registry: CPU, minor page faults and latency per search,
optionally with py-spy sampling the registry meanwhile.

    uv run python bench/search_latency.py [--corpus small|large] [--searches 150]
        [--registry-python PY] [--py-spy out.txt [--native]]

Starts the corpus's MCP servers and a registry process (`python -m toolbus_registry`, from
`--registry-python`: point it at another checkout's venv to measure that code) on a fresh subject
prefix, registers the corpus, waits for its background embedding, then runs `--searches` of the
labelled queries one after another through NATS and prints p50 / p99, the registry's CPU time and
minor page faults per search (from /proc). With `--py-spy`, py-spy records the registry meanwhile
(raw format, 200 Hz) into that file. Used for docs/design.md, "Query latency, measured again".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nats
from toolbus_devstack.services import stop_process

from bench.harness import percentile
from bench.search import (
    NATS_URL,
    cpu_seconds,
    create_body,
    metric,
    registry_env,
    serve,
    start_registry,
    tear_down,
)
from tests.registry.search.labelled import load_queries, load_tools, load_twilio_tasks
from tests.registry.search.openapi_corpus import load_large_corpus


def minor_faults(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", choices=("small", "large"), default="small")
    parser.add_argument("--searches", type=int, default=150)
    parser.add_argument("--registry-python", default=None)
    parser.add_argument("--py-spy", default=None, help="record the registry with py-spy into this file")
    parser.add_argument("--native", action="store_true", help="py-spy with C frames (pauses the process)")
    args = parser.parse_args()
    if args.corpus == "small":
        tools, queries = load_tools(), load_queries()
    else:
        tools, queries = load_large_corpus(), load_twilio_tasks()
    servers = await serve(tools)
    prefix = f"tblat{uuid.uuid4().hex[:8]}"
    env = registry_env(prefix)
    body = create_body(servers)
    nc = await nats.connect(NATS_URL)
    registry = start_registry(env, args.registry_python)
    try:
        created = json.loads((await nc.request(f"{prefix}.toolsets.create", body, timeout=60)).data)
        toolset_id = created["data"]["id"]
        await asyncio.sleep(0.3)
        while metric(registry.base_url, "toolbus_search_toolsets_embedding") not in (0.0, None):  # noqa: ASYNC110 - polls another process
            await asyncio.sleep(0.2)
        spy = None
        if args.py_spy:
            mode = "--native" if args.native else "--nonblocking"
            spy = subprocess.Popen(  # noqa: ASYNC220 - a sampler beside the bench, nothing else runs on this loop
                [
                    "py-spy",
                    "record",
                    mode,
                    "-r",
                    "200",
                    "-f",
                    "raw",
                    "-o",
                    args.py_spy,
                    "-p",
                    str(registry.proc.pid),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            await asyncio.sleep(1.5)
        pid = registry.proc.pid
        lat = []
        cpu0, faults0 = cpu_seconds(pid), minor_faults(pid)
        for i in range(args.searches):
            payload = {"id": toolset_id, "query": queries[i % len(queries)].query, "limit": 5}
            t0 = time.perf_counter()
            await nc.request(f"{prefix}.toolsets.search", json.dumps(payload).encode(), timeout=30)
            lat.append(time.perf_counter() - t0)
        cpu = (cpu_seconds(pid) - cpu0) / args.searches
        faults = (minor_faults(pid) - faults0) / args.searches
        print(
            f"{args.corpus}: {args.searches} searches, p50 {percentile(lat, 0.5) * 1e3:.1f} ms, "
            f"p99 {percentile(lat, 0.99) * 1e3:.1f} ms, registry CPU {cpu * 1e3:.1f} ms and "
            f"{faults:.0f} minor faults a search"
        )
        if spy is not None:
            spy.send_signal(2)
            spy.wait()
    finally:
        stop_process(registry.proc)
        await tear_down(nc, prefix, servers)


if __name__ == "__main__":
    asyncio.run(main())
