"""How much toolbus's MCP client adds to a tool call: `McpConnection.call_tool` vs a bare `mcp.Client`.

Starts a local MCP server (tests.support.mcp_servers, in a subprocess so it does not share this
process's GIL), then times `echo` calls, sequentially and with 16 in flight, side by side through
a bare `mcp.Client` (the baseline), `McpConnection.call_tool` (on a 2026 server: the fast path)
and `McpConnection` with `fast_calls=False` (the SDK path), each on one reused httpx2 client.
Each row gives p50/p99 latency, calls/s and this process's CPU per call (`time.process_time`).
Also times `McpPool.get` on a hit. Bounded loops; stops by itself.

    uv run python bench/mcp_direct.py [--calls 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import cast

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import RequestParamsMeta
from toolbus_mcp_client import IDEMPOTENCY_META_KEY, McpConnection, McpPool

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import in_flight, percentile, sequential, start_mcp_server


def line(label: str, latencies: list[float], rate: float, cpu: float) -> str:
    p50 = statistics.median(latencies) * 1000
    p99 = percentile(latencies, 0.99) * 1000
    return (
        f"{label:<40} p50 {p50:6.2f} ms   p99 {p99:6.2f} ms   {rate:7.0f} calls/s"
        f"   cpu {cpu * 1e6:5.0f} µs/call"
    )


async def bench(url: str, n: int) -> None:
    conn = await McpConnection.open(url, {"Authorization": "Bearer bench"}, server_name="bench")
    slow = await McpConnection.open(
        url, {"Authorization": "Bearer bench"}, server_name="bench", fast_calls=False
    )
    http = create_mcp_http_client(headers={"Authorization": "Bearer bench"})
    async with http, Client(streamable_http_client(url, http_client=http), mode="auto") as bare:

        async def ours() -> object:
            return await conn.call_tool("echo", {"text": "hi"}, idempotency_key=uuid.uuid4().hex, timeout=30)

        async def ours_sdk() -> object:
            return await slow.call_tool("echo", {"text": "hi"}, idempotency_key=uuid.uuid4().hex, timeout=30)

        async def sdk() -> object:
            meta = cast(RequestParamsMeta, {IDEMPOTENCY_META_KEY: uuid.uuid4().hex})
            return await bare.call_tool("echo", {"text": "hi"}, meta=meta)

        for call in (ours, ours_sdk, sdk):  # warm up: the bare client lists tools once, all open 16 sockets
            await sequential(call, 50)
            await in_flight(call, 200)
        print(f"echo over streamable HTTP (SSE answers), protocol {conn.protocol_version}, {n} calls per row")
        rows = [
            ("bare mcp.Client.call_tool", sdk),
            ("McpConnection.call_tool (fast path)", ours),
            ("McpConnection.call_tool (SDK path)", ours_sdk),
        ]
        for round_no in (1, 2):  # the second round runs in the other order, to expose drift
            for label, call in rows:
                print(line(f"{label} seq [{round_no}]", *await sequential(call, n)))
            for label, call in rows:
                print(line(f"{label} x16 [{round_no}]", *await in_flight(call, n * 2)))
            rows.reverse()
    await slow.aclose()
    start = time.perf_counter()
    for _ in range(20):
        tools = await conn.list_tools()
    print(f"McpConnection.list_tools, {len(tools)} tools: {(time.perf_counter() - start) / 20 * 1000:.2f} ms")
    await conn.aclose()

    start = time.perf_counter()
    for _ in range(10):
        await (await McpConnection.open(url, {}, server_name="bench")).aclose()
    print(f"McpConnection.open + aclose: {(time.perf_counter() - start) / 10 * 1000:.2f} ms")

    pool = McpPool()
    headers = {"Authorization": "Bearer bench"}
    await pool.get(url, headers, server_name="bench")
    hits = 100_000
    start = time.perf_counter()
    for _ in range(hits):
        await pool.get(url, headers, server_name="bench")
    print(f"McpPool.get on a hit: {(time.perf_counter() - start) / hits * 1e6:.2f} µs")
    await pool.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls per sequential row (x2 for x16 rows)")
    args = parser.parse_args()
    proc, url = start_mcp_server(tools=100)
    try:
        asyncio.run(bench(url, args.calls))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
