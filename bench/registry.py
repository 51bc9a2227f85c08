"""Registration time of a toolset of 10 servers x 100 tools served locally, beside the time of
just listing those servers' tools with the MCP client, in the same run.

    uv run python bench/registry.py [--rounds 10]

Needs NATS (JetStream) at TOOLBUS_NATS_URL (default 127.0.0.1:4222). Runs the registry in-process
under a fresh subject prefix and deletes its buckets at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import contextlib

from toolbus_common import Settings
from toolbus_common.runtime import tune_gc
from toolbus_mcp_client import McpConnection
from toolbus_registry.app import RegistryApp

from bench.harness import start_mcp_server, stop_processes

SERVERS, TOOLS = 10, 100


def serve(count: int, prefix: str) -> tuple[list[subprocess.Popen[str]], list[str]]:
    """`count` MCP servers of TOOLS synthetic tools each, in their own processes."""
    started = [start_mcp_server(TOOLS, f"{prefix}{i}") for i in range(count)]
    return [proc for proc, _ in started], [url for _, url in started]


async def list_all(urls: list[str]) -> int:
    async def one(i: int, url: str) -> int:
        conn = await McpConnection.open(url, {}, server_name=f"srv{i}")
        try:
            return len(await conn.list_tools())
        finally:
            await conn.aclose()

    return sum(await asyncio.gather(*(one(i, u) for i, u in enumerate(urls))))


async def main(rounds: int) -> None:
    prefix = f"tbbench{uuid.uuid4().hex[:8]}"
    settings = Settings(
        subject_prefix=prefix, nats_url=os.environ.get("TOOLBUS_NATS_URL", "nats://127.0.0.1:4222")
    )
    servers, urls = serve(SERVERS, "s")
    app = RegistryApp(settings)
    await app.start()
    tune_gc()  # as `python -m toolbus_registry` does once started
    import nats

    nc = await nats.connect(settings.nats_url)
    body = orjson.dumps({"mcp": [{"name": f"srv{i}", "url": u} for i, u in enumerate(urls)]})
    try:
        # warm both paths once (imports, first connections, first store write)
        await list_all(urls)
        await nc.request(settings.subjects.toolsets_create, body, timeout=60)
        listing, registering = [], []
        for _ in range(rounds):
            t = time.perf_counter()
            count = await list_all(urls)
            listing.append(time.perf_counter() - t)
            t = time.perf_counter()
            reply = orjson.loads((await nc.request(settings.subjects.toolsets_create, body, timeout=60)).data)
            registering.append(time.perf_counter() - t)
            assert reply["ok"], reply
        # a fresh registration (a toolset not seen before: store write + declarations rendered)
        fresh, fresh_urls = serve(SERVERS, "f")
        fresh_body = orjson.dumps({"mcp": [{"name": f"srv{i}", "url": u} for i, u in enumerate(fresh_urls)]})
        t = time.perf_counter()
        fresh_reply = orjson.loads(
            (await nc.request(settings.subjects.toolsets_create, fresh_body, timeout=60)).data
        )
        fresh_time = time.perf_counter() - t
        fresh_list_t = time.perf_counter()
        await list_all(fresh_urls)
        fresh_list = time.perf_counter() - fresh_list_t
        stop_processes(fresh)
        assert fresh_reply["ok"], fresh_reply
    finally:
        await app.stop()
        stop_processes(servers)
        js = nc.jetstream()
        for bucket in ("toolsets", "workflows"):
            for kind in ("OBJ_", "KV_"):
                with contextlib.suppress(Exception):
                    await js.delete_stream(kind + settings.js_name(bucket))
        await nc.close()

    lp, rp = statistics.median(listing), statistics.median(registering)
    print(f"toolset: {SERVERS} servers x {TOOLS} tools = {count} tools, {rounds} rounds, medians")
    print(f"{'list tools directly (mcp client, concurrent)':<52} {lp * 1000:8.1f} ms")
    print(
        f"{'toolsets.create over NATS (same toolset again)':<52} {rp * 1000:8.1f} ms   +{(rp / lp - 1) * 100:5.1f}%"
    )
    print(f"{'list tools directly, fresh servers (1 run)':<52} {fresh_list * 1000:8.1f} ms")
    print(
        f"{'toolsets.create, new toolset (1 run: store + decls)':<52} {fresh_time * 1000:8.1f} ms   "
        f"+{(fresh_time / fresh_list - 1) * 100:5.1f}%"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    asyncio.run(main(parser.parse_args().rounds))
