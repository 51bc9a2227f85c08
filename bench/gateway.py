"""The same echo call three ways, in one run: directly to the MCP server (the baseline), over
NATS `calls.invoke` (toolbus without the gateway), and through the gateway with the `mcp`
package's client (2026-07-28 and 2025-11-25): p50/p99 latency sequentially, calls/s with 16 in
flight, and the gateway's CPU per call and RSS. Everything runs as processes on this machine
(`BenchStack` plus `python -m toolbus_gateway`); bounded loops, stops by itself. With
`--contextforge`, the same call through IBM ContextForge's virtual server too (stateful
sessions; installed into .cache/contextforge-venv as `make bench-peers` does).

    uv run python bench/gateway.py [--calls 500] [--contextforge]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import Row, cpu_seconds, in_flight, percentile, rss_mib, sequential
from bench.stack import SERVICES, BenchStack


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def line(label: str, row: Row, gateway_cpu: float | None = None) -> str:
    latencies, rate, _ = row
    p50 = statistics.median(latencies) * 1000
    p99 = percentile(latencies, 0.99) * 1000
    cpu = f"   gateway cpu {gateway_cpu * 1e3:5.2f} ms/call" if gateway_cpu is not None else ""
    return f"{label:<44} p50 {p50:6.2f} ms   p99 {p99:6.2f} ms   {rate:6.0f} calls/s{cpu}"


async def main(calls: int, contextforge: bool) -> None:
    port = _free_port()
    stack = BenchStack((*SERVICES, "gateway"))
    stack.env["TOOLBUS_GATEWAY_PORT"] = str(port)
    async with stack, AsyncExitStack() as clients:
        gateway_pid = stack.pids()["gateway"]
        idle_rss = stack.idle_rss["gateway"]
        created = await stack.ok(
            stack.subjects.tokens_create, {"namespace": "bench", "toolsets": [stack.toolset_id]}
        )
        token = created["token"]
        gateway_url = f"http://127.0.0.1:{port}/mcp/{stack.toolset_id}"

        async def client(url: str, mode: str, headers: dict[str, str]) -> Any:
            http = await clients.enter_async_context(create_mcp_http_client(headers=headers))
            return await clients.enter_async_context(
                Client(streamable_http_client(url, http_client=http), mode=mode)
            )

        direct = await client(stack.url, "auto", {})
        modern = await client(gateway_url, "auto", {"Authorization": f"Bearer {token}"})
        legacy = await client(gateway_url, "legacy", {"Authorization": f"Bearer {token}"})

        async def call_direct() -> object:
            return await direct.call_tool("echo", {"text": "hi"})

        async def call_modern() -> object:
            return await modern.call_tool("echo.echo", {"text": "hi"})

        async def call_legacy() -> object:
            return await legacy.call_tool("echo.echo", {"text": "hi"})

        rows: list[tuple[str, Any, bool]] = [
            ("direct: mcp.Client -> MCP server", call_direct, False),
            ("toolbus: calls.invoke over NATS", stack.invoke, False),
            ("gateway: mcp.Client 2026-07-28", call_modern, True),
            ("gateway: mcp.Client 2025-11-25 session", call_legacy, True),
        ]
        peer = None
        finished = asyncio.Event()
        if contextforge:
            from bench.peers import VERSION, ContextForge, install, own_client

            why = install(VERSION)
            if why is not None:
                print(f"ContextForge {VERSION} not measured: {why}")
            else:
                peer = ContextForge(stateful=True)
                clients.callback(peer.stop)
                clients.callback(finished.set)
                mcp_url = await asyncio.to_thread(peer.start_serving, stack.url)
                opened: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                owner = asyncio.create_task(own_client(peer.token, mcp_url, opened, finished))
                peer_client = await opened
                tool = peer.tool

                async def call_peer() -> object:
                    return await peer_client.call_tool(tool, {"text": "hi"})

                rows.append((f"ContextForge {VERSION} stateful sessions", call_peer, False))
        for _, call, _ in rows:  # warm up
            await sequential(call, 30)
            await in_flight(call, 100)
        print(f"echo, {calls} calls a row (x16: {calls * 2}); gateway RSS idle {idle_rss:.1f} MiB")
        for label, call, through in rows:
            before = cpu_seconds(gateway_pid)
            row = await sequential(call, calls)
            used = (cpu_seconds(gateway_pid) - before) / calls if through else None
            print(line(f"{label} seq", row, used))
        for label, call, through in rows:
            before = cpu_seconds(gateway_pid)
            row = await in_flight(call, calls * 2)
            used = (cpu_seconds(gateway_pid) - before) / (calls * 2) if through else None
            print(line(f"{label} x16", row, used))
        print(f"gateway RSS after the run: {rss_mib(gateway_pid):.1f} MiB")
        if peer is not None and peer.proc is not None:
            print(f"ContextForge RSS after the run: {rss_mib(peer.proc.pid):.1f} MiB")
            finished.set()
            await asyncio.wait_for(owner, 30)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--contextforge", action="store_true", help="ContextForge's virtual server too")
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.contextforge))
