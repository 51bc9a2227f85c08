"""The same echo call three ways, in one run: directly to the MCP server (the baseline), over
NATS `calls.invoke` (toolbus without the gateway), and through the gateway with the `mcp`
package's client (2026-07-28 and 2025-11-25): p50/p99 latency sequentially, calls/s with 16 in
flight, and the gateway's CPU per call and RSS. Everything runs as processes on this machine
(`BenchStack` plus `python -m toolbus_gateway`); bounded loops, stops by itself. With
`--contextforge`, the same call through IBM ContextForge's virtual server too (stateful
sessions; installed into .cache/contextforge-venv as `make bench-peers` does). With
`--instructions`, instead: the instructions a request costs (valgrind's callgrind, repeatable
where times on a loaded machine are not) in the gateway, with 16 in flight, beside the MCP SDK's
own server serving the echo tool directly (the baseline) and a gateway asking Redis for the token
on every request (`TOOLBUS_GATEWAY_TOKEN_CACHE_SECONDS=0`).

    uv run python bench/gateway.py [--calls 500] [--contextforge] [--instructions]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import stat
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from toolbus_devstack.services import launch_service, wait_ready

from bench.harness import Row, cpu_seconds, in_flight, percentile, rss_mib, sequential
from bench.stack import SERVICES, BenchStack

ROOT = Path(__file__).resolve().parent.parent


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


class Callgrind:
    """Processes started under `valgrind --tool=callgrind` with counting off; `count` switches it on
    for one load and reads the instructions it took."""

    def __init__(self) -> None:
        valgrind = shutil.which("valgrind")
        if valgrind is None:
            raise SystemExit("valgrind not found (apt-get install valgrind)")
        self.work = Path(tempfile.mkdtemp(prefix="gateway-callgrind-"))
        self.python = self.work / "python"
        self.python.write_text(
            f"#!/bin/sh\nexec {valgrind} --tool=callgrind --instr-atstart=no "
            f'--callgrind-out-file={self.work}/out.%p {sys.executable} "$@"\n'
        )
        self.python.chmod(self.python.stat().st_mode | stat.S_IXUSR)

    def _control(self, pid: int, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)

    async def count(self, pid: int, call: Callable[[], Awaitable[object]], n: int) -> float:
        """Instructions a call of `call`, `n` calls with 16 in flight, in process `pid`."""
        await in_flight(call, 50)  # warm
        for path in self.work.glob(f"out.{pid}*"):
            path.unlink()
        self._control(pid, "-z")
        self._control(pid, "-i", "on")
        await in_flight(call, n)
        self._control(pid, "-i", "off")
        self._control(pid, "-d")
        dump = max(self.work.glob(f"out.{pid}*"), key=os.path.getmtime)
        totals = [
            ln
            for ln in dump.read_text(errors="replace").splitlines()
            if ln.startswith(("totals:", "summary:"))
        ]
        return int(totals[-1].split()[1]) / n


async def instructions(calls: int) -> None:
    grind = Callgrind()
    ports = [_free_port(), _free_port()]
    stack = BenchStack((*SERVICES, "gateway"), python={"gateway": str(grind.python)}, ready=600)
    stack.env["TOOLBUS_GATEWAY_PORT"] = str(ports[0])
    async with stack, AsyncExitStack() as clients:
        echo = await asyncio.to_thread(
            subprocess.Popen,
            [str(grind.python), "-m", "tests.support.mcp_servers"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert echo.stdout is not None
        echo_url = (await asyncio.to_thread(echo.stdout.readline)).strip()
        clients.callback(echo.wait, 30)
        clients.callback(echo.terminate)
        uncached = launch_service(
            "gateway",
            {**stack.env, "TOOLBUS_GATEWAY_PORT": str(ports[1]), "TOOLBUS_GATEWAY_TOKEN_CACHE_SECONDS": "0"},
            python=str(grind.python),
        )
        clients.callback(uncached.stop)
        await asyncio.to_thread(
            wait_ready, uncached.ready_url, uncached.proc, uncached.log_path, what="gateway", timeout=600
        )
        token = (
            await stack.ok(
                stack.subjects.tokens_create, {"namespace": "bench", "toolsets": [stack.toolset_id]}
            )
        )["token"]
        bearer = {"Authorization": f"Bearer {token}"}

        async def client(url: str, mode: str, headers: dict[str, str]) -> Any:
            http = await clients.enter_async_context(create_mcp_http_client(headers=headers))
            return await clients.enter_async_context(
                Client(streamable_http_client(url, http_client=http), mode=mode)
            )

        path = f"/mcp/{stack.toolset_id}"
        direct = await client(echo_url, "auto", {})
        modern = await client(f"http://127.0.0.1:{ports[0]}{path}", "auto", bearer)
        legacy = await client(f"http://127.0.0.1:{ports[0]}{path}", "legacy", bearer)
        plain = await client(f"http://127.0.0.1:{ports[1]}{path}", "auto", bearer)
        gateway, echo_pid = stack.pids()["gateway"], echo.pid
        rows: list[tuple[str, int, Callable[[], Awaitable[object]]]] = [
            ("MCP SDK server alone: tools/call", echo_pid, lambda: direct.call_tool("echo", {"text": "hi"})),
            ("MCP SDK server alone: tools/list", echo_pid, direct.list_tools),
            (
                "gateway 2026-07-28: tools/call",
                gateway,
                lambda: modern.call_tool("echo.echo", {"text": "hi"}),
            ),
            ("gateway 2026-07-28: tools/list", gateway, modern.list_tools),
            (
                "gateway 2025-11-25 session: tools/call",
                gateway,
                lambda: legacy.call_tool("echo.echo", {"text": "hi"}),
            ),
            (
                "gateway 2026-07-28, token cache off: tools/call",
                uncached.proc.pid,
                lambda: plain.call_tool("echo.echo", {"text": "hi"}),
            ),
        ]
        print(f"instructions a request (callgrind, {calls} requests, 16 in flight)")
        for label, pid, call in rows:
            print(f"{label:<50} {await grind.count(pid, call, calls) / 1e6:6.2f} M", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--contextforge", action="store_true", help="ContextForge's virtual server too")
    parser.add_argument("--instructions", action="store_true", help="instructions a request (callgrind)")
    args = parser.parse_args()
    if args.instructions:
        asyncio.run(instructions(min(args.calls, 300)))
    else:
        asyncio.run(main(args.calls, args.contextforge))
