"""What the dispatcher adds to an MCP tool call: `calls.invoke` vs a direct MCP call.

Starts a local MCP server (tests.support.mcp_servers) and a dispatcher (`python -m
toolbus_dispatcher`), each in its own process, on a fresh prefix of the local NATS and Redis; pins
the server's tools straight into the toolset store (no registry needed); then times `echo` calls
(a) directly with a bare `mcp.Client` on one reused HTTP client (the baseline), (a2) directly
with toolbus's own MCP client, and (b) through `calls.invoke`,
sequentially and with 16 in flight, and prints p50/p99 latency and calls/s side by side; then how
long after its invoke reply a call's `completed` event arrives (events leave through the outbox
relay since v1.1: this is what that costs a harness that follows events).
Bounded loops; cleans up its streams and keys; stops by itself.

    uv run python bench/dispatch.py [--calls 1000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import nats
import orjson
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import RequestParamsMeta
from redis.asyncio import Redis
from toolbus_common.canonical import content_id
from toolbus_common.toolsets import ToolsetStore
from toolbus_contracts import PinnedToolset, Subjects
from toolbus_mcp_client import IDEMPOTENCY_META_KEY, McpPool

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import Row, in_flight, percentile, sequential, start_mcp_server
from tests.support.infra import free_port, js_name, start_service, stop_process, unique_prefix

SDK = "direct: bare mcp.Client (baseline)"
OURS = "direct: toolbus McpConnection"
INVOKE = "through toolbus: calls.invoke"
NATS_URL = os.environ.get("TOOLBUS_NATS_URL", "nats://127.0.0.1:4222")
REDIS_URL = os.environ.get("TOOLBUS_REDIS_URL", "redis://127.0.0.1:6379/0")
Call = Callable[[], Awaitable[object]]


async def main(calls: int, rounds: int) -> None:
    prefix = unique_prefix("tbbench")
    subjects = Subjects(prefix)
    server, url = start_mcp_server()
    env = {
        "TOOLBUS_NATS_URL": NATS_URL,
        "TOOLBUS_REDIS_URL": REDIS_URL,
        "TOOLBUS_SUBJECT_PREFIX": prefix,
        "TOOLBUS_LOG_LEVEL": "WARNING",
    }
    dispatcher = start_service("dispatcher", env, port=free_port())
    nc = await nats.connect(NATS_URL)
    redis: Any = Redis.from_url(REDIS_URL)
    pool = McpPool()
    http = create_mcp_http_client()
    bare = Client(streamable_http_client(url, http_client=http), mode="auto")
    await http.__aenter__()
    await bare.__aenter__()
    try:
        conn = await pool.get(url, {}, server_name="echo")
        listed = await conn.list_tools()
        tools = [t for t in listed if t["name"] == "echo"]
        pinned = PinnedToolset.model_validate({"servers": [{"name": "echo", "url": url, "tools": tools}]})
        ts = content_id("ts_", pinned.model_dump(mode="json", exclude_none=True))
        store = ToolsetStore(nc.jetstream(), js_name(prefix, "toolsets"))
        await store.open()
        await store.put(ts, pinned)
        reply = orjson.loads((await nc.request(subjects.runs_open, orjson.dumps({"toolsetId": ts}), 5)).data)
        run_id = reply["data"]["runId"]
        invoke_body = orjson.dumps({"runId": run_id, "tool": "echo.echo", "input": {"text": "hi"}})

        async def direct() -> object:
            result = await conn.call_tool(
                "echo", {"text": "hi"}, idempotency_key=uuid.uuid4().hex, timeout=30
            )
            assert not result.is_error
            return result

        async def sdk() -> object:
            meta = cast(RequestParamsMeta, {IDEMPOTENCY_META_KEY: uuid.uuid4().hex})
            result = await bare.call_tool("echo", {"text": "hi"}, meta=meta)
            assert not result.is_error
            return result

        async def through() -> object:
            msg = await nc.request(subjects.calls_invoke, invoke_body, timeout=30)
            if not msg.data.startswith(b'{"ok":true'):
                raise RuntimeError(msg.data[:300].decode())
            return msg

        paths = ((SDK, sdk), (OURS, direct), (INVOKE, through))
        for _, fn in paths:  # warm up connections, caches, JIT-less paths
            await sequential(fn, 200)
            await in_flight(fn, 200)

        results: dict[tuple[str, str], list[Row]] = {}
        cpu = 0.0
        invoked = 0
        for _ in range(rounds):
            for name, fn in paths:
                before = cpu_seconds(dispatcher.proc.pid)
                results.setdefault((name, "sequential"), []).append(await sequential(fn, calls))
                results.setdefault((name, "16 in flight"), []).append(await in_flight(fn, calls * 2))
                if name == INVOKE:
                    cpu += cpu_seconds(dispatcher.proc.pid) - before
                    invoked += calls * 3

        print(f"\n{calls} sequential calls and {calls * 2} calls 16 in flight per round, {rounds} rounds")
        print(f"{'mode':<14}{'path':<34}{'p50 ms':>9}{'p99 ms':>9}{'calls/s':>10}")
        summary: dict[tuple[str, str], tuple[float, float, float]] = {}
        for (name, mode), runs in results.items():
            lat = [x for latencies, _, _ in runs for x in latencies]
            rate = statistics.median(rate for _, rate, _ in runs)
            summary[(name, mode)] = (percentile(lat, 0.5) * 1e3, percentile(lat, 0.99) * 1e3, rate)
        for mode in ("sequential", "16 in flight"):
            for name, _ in paths:
                p50, p99, rate = summary[(name, mode)]
                print(f"{mode:<14}{name:<34}{p50:>9.3f}{p99:>9.3f}{rate:>10.0f}")
        for base in (SDK, OURS):
            added = summary[(INVOKE, "sequential")][0] - summary[(base, "sequential")][0]
            ratio = summary[(INVOKE, "16 in flight")][2] / summary[(base, "16 in flight")][2]
            print(
                f"\ncalls.invoke vs {base.strip()}: adds {added:+.3f} ms at p50 sequential; "
                f"{ratio:.2f}x its throughput with 16 in flight"
            )
        print(
            f"\ndispatcher process CPU per calls.invoke (user+system, all its work incl. the event "
            f"relay): {cpu / invoked * 1e6:.0f} µs over {invoked} calls (less sensitive to a busy "
            "machine than latency)"
        )
        lags = await event_lag(nc, subjects, run_id, invoke_body, min(calls, 500))
        print(
            f"\ncompleted event after the invoke reply ({len(lags)} sequential calls): "
            f"p50 {percentile(lags, 0.5) * 1e3:.3f} ms, p99 {percentile(lags, 0.99) * 1e3:.3f} ms"
        )
        await nc.request(subjects.runs_close, orjson.dumps({"runId": run_id}), 10)
    finally:
        await bare.__aexit__(None, None, None)
        await http.__aexit__(None, None, None)
        await pool.aclose()
        stop_process(dispatcher.proc)
        server.terminate()
        with contextlib.suppress(Exception):
            server.wait(10)
        js = nc.jetstream()
        for name in ("EVENTS", "INTERNAL"):
            with contextlib.suppress(Exception):
                await js.delete_stream(js_name(prefix, name))
        for bucket in ("toolsets", "outputs"):
            with contextlib.suppress(Exception):
                await js.delete_stream("OBJ_" + js_name(prefix, bucket))
        keys = [k async for k in redis.scan_iter(match=f"{prefix}:*", count=1000)]
        for i in range(0, len(keys), 1000):
            await redis.unlink(*keys[i : i + 1000])
        await redis.aclose()
        await nc.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def event_lag(nc: Any, subjects: Subjects, run_id: str, body: bytes, n: int) -> list[float]:
    """Seconds from each invoke reply to its `completed` event (core subscription)."""
    loop = asyncio.get_running_loop()
    arrived: dict[str, float] = {}

    async def on_event(msg: Any) -> None:
        event = orjson.loads(msg.data)
        if event["type"] == "completed":
            arrived[event["callId"]] = loop.time()

    sub = await nc.subscribe(subjects.run_events(run_id), cb=on_event)
    lags: list[float] = []
    try:
        for _ in range(n):
            msg = await nc.request(subjects.calls_invoke, body, timeout=30)
            replied = loop.time()
            call_id = orjson.loads(msg.data)["data"]["callId"]
            for _ in range(2000):
                if call_id in arrived:
                    break
                await asyncio.sleep(0.0005)
            if call_id in arrived:
                lags.append(max(0.0, arrived[call_id] - replied))
    finally:
        await sub.unsubscribe()
    return lags


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.run(main(args.calls, args.rounds))
    except ImportError:
        asyncio.run(main(args.calls, args.rounds))
