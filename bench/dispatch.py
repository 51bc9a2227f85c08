"""What the dispatcher adds to an MCP tool call: `calls.invoke` vs the same call made directly.

On a `BenchStack` (the four services as processes, an MCP echo server in its own process, the echo
toolset registered through the registry), times `echo` calls (a) directly with a bare `mcp.Client`
on one reused HTTP client, (b) directly with toolbus's own `McpConnection` (the fastest direct
client: the baseline), and (c) through `calls.invoke`, sequentially and with 16 in flight, with
one dispatcher process and then with two; the dispatcher's own CPU per call (from /proc); and how
long after its invoke reply a call's `completed` event arrives (events leave through the outbox
relay since v1.1: what that costs a harness that follows events).
Beside them, the floor under what a sequential call adds in this design (the call stored before it
starts, its outcome before the reply): one bare NATS request/reply (a raw nats-py responder on the
same server) plus the call's two Redis scripts (`create_call.lua` then `finish_call.lua`,
`bench/semaphore.py`'s `ScriptStack`, on the same Redis), alternated with the calls in the same
rounds.
Bounded loops; cleans up its streams and keys; stops by itself.

    uv run python bench/dispatch.py [--calls 1000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path
from typing import Any, cast

import nats
import orjson
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import RequestParamsMeta
from redis.asyncio import Redis
from toolbus_common.script_pipe import ScriptPipe
from toolbus_mcp_client import IDEMPOTENCY_META_KEY, McpConnection

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import (
    Call,
    Figure,
    Row,
    cpu_seconds,
    in_flight,
    latency_figures,
    merge,
    percentile,
    print_table,
    sequential,
)
from bench.semaphore import ScriptStack
from bench.stack import BenchStack

SECTION = "call through the dispatcher"
SDK = "direct bare mcp.Client"
OURS = "direct McpConnection"
FLOOR = "floor: bare NATS round trip + the call's 2 Redis scripts"


async def measure(stack: BenchStack, calls: int, rounds: int, *, warmup: int = 200) -> list[Figure]:
    """The dispatch figures on a running stack (adds a second dispatcher to it on the way)."""
    conn = await McpConnection.open(stack.url, {}, server_name="echo")
    http = create_mcp_http_client()
    bare = Client(streamable_http_client(stack.url, http_client=http), mode="auto")
    await http.__aenter__()
    await bare.__aenter__()
    responder = await nats.connect(stack.nats_url)
    redis: Redis[bytes] = Redis.from_url(stack.redis_url)
    pipe = ScriptPipe(stack.redis_url)
    scripts = ScriptStack(pipe, redis)
    try:
        await scripts.open()
        floor_subject = f"{stack.prefix}.bench.floor"

        async def respond(msg: Any) -> None:
            await msg.respond(b"{}")

        await responder.subscribe(floor_subject, cb=respond)
        await responder.flush()

        async def bare_nats() -> object:
            return await stack.nc.request(floor_subject, stack.invoke_body, timeout=30)

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

        dispatchers = [stack.services["dispatcher"].proc.pid]

        async def dispatcher_cpu(call: Call, n: int) -> tuple[Row, float]:
            before = sum(cpu_seconds(p) for p in dispatchers)
            row = await in_flight(call, n)
            return row, (sum(cpu_seconds(p) for p in dispatchers) - before) / n

        async def rounds_of(paths: dict[str, Call]) -> tuple[dict[tuple[str, str], Row], float]:
            for fn in paths.values():  # warm up connections and caches
                await sequential(fn, warmup)
                await in_flight(fn, warmup)
            got: dict[tuple[str, str], list[Row]] = {}
            cpu: list[float] = []
            for _ in range(rounds):
                for name, fn in paths.items():
                    got.setdefault((name, "sequential"), []).append(await sequential(fn, calls))
                    if name == "invoke":
                        row, per_call = await dispatcher_cpu(fn, calls * 2)
                        cpu.append(per_call)
                    else:
                        row = await in_flight(fn, calls * 2)
                    got.setdefault((name, "16 in flight"), []).append(row)
            return {k: merge(v) for k, v in got.items()}, sorted(cpu)[len(cpu) // 2]

        one, cpu_one = await rounds_of(
            {
                SDK: sdk,
                OURS: direct,
                "invoke": stack.invoke,
                "nats": bare_nats,
                "scripts": scripts.acquire_release,
            }
        )
        dispatchers.append((await stack.add_dispatcher()).proc.pid)
        two, cpu_two = await rounds_of({OURS: direct, "invoke": stack.invoke})

        figures: list[Figure] = []
        for label, got in (("1 dispatcher", one), ("2 dispatchers", two)):
            for mode in ("sequential", "16 in flight"):
                figures += latency_figures(
                    SECTION,
                    f"calls.invoke, {label}, {mode}:",
                    got[("invoke", mode)],
                    f"{OURS}",
                    got[(OURS, mode)],
                )
        for mode in ("sequential", "16 in flight"):
            figures += latency_figures(
                SECTION, f"calls.invoke, 1 dispatcher, {mode}:", one[("invoke", mode)], SDK, one[(SDK, mode)]
            )
        for label, cpu, got in (("1 dispatcher", cpu_one, one), ("2 dispatchers", cpu_two, two)):
            figures.append(
                Figure(
                    SECTION,
                    f"dispatcher CPU per call, {label}, 16 in flight",
                    cpu * 1e3,
                    "ms",
                    f"{OURS} client CPU/call",
                    got[(OURS, "16 in flight")][2] * 1e3,
                )
            )
        figures.append(floor_figure(one))
        lags = await event_lag(stack, min(calls, 500))
        invoke_p50 = percentile(one[("invoke", "sequential")][0], 0.5) * 1e3
        for q in (0.5, 0.99):
            figures.append(
                Figure(
                    SECTION,
                    f"completed event after the invoke reply, sequential: p{int(q * 100)}",
                    percentile(lags, q) * 1e3 if lags else None,
                    "ms",
                    "calls.invoke, 1 dispatcher, sequential p50",
                    invoke_p50,
                    "" if lags else "not measured yet: no completed event arrived",
                )
            )
        return figures
    finally:
        await scripts.close()
        await pipe.aclose()
        await redis.aclose()  # type: ignore[attr-defined]  # redis>=5; stubs lag
        await responder.close()
        await bare.__aexit__(None, None, None)
        await http.__aexit__(None, None, None)
        await conn.aclose()


def floor_figure(one: dict[tuple[str, str], Row]) -> Figure:
    """What a sequential `calls.invoke` adds over the direct call (p50 less p50), beside the floor
    under it: a bare NATS request/reply and the call's two scripts, each a p50 of the same rounds."""

    def p50(path: str) -> float:
        return percentile(one[(path, "sequential")][0], 0.5) * 1e3

    nats_p50, scripts_p50 = p50("nats"), p50("scripts")
    return Figure(
        SECTION,
        f"calls.invoke, 1 dispatcher, sequential: p50 less {OURS}'s",
        p50("invoke") - p50(OURS),
        "ms",
        f"{FLOOR} (p50s)",
        nats_p50 + scripts_p50,
        f"NATS {nats_p50:.3f} + scripts {scripts_p50:.3f} ms",
    )


async def event_lag(stack: BenchStack, n: int) -> list[float]:
    """Seconds from each invoke reply to its `completed` event (core subscription)."""
    arrived: dict[str, float] = {}

    async def on_event(msg: Any) -> None:
        event = orjson.loads(msg.data)
        if event["type"] == "completed":
            arrived[event["callId"]] = time.perf_counter()  # uvloop's loop.time() is in whole ms

    sub = await stack.nc.subscribe(stack.subjects.run_events(stack.run_id), cb=on_event)
    lags: list[float] = []
    try:
        for _ in range(n):
            msg = await stack.invoke()
            replied = time.perf_counter()
            call_id = orjson.loads(msg.data)["data"]["callId"]  # type: ignore[attr-defined]
            for _ in range(2000):
                if call_id in arrived:
                    break
                await asyncio.sleep(0.0005)
            if call_id in arrived:
                lags.append(max(0.0, arrived[call_id] - replied))
    finally:
        await sub.unsubscribe()
    return lags


async def main(calls: int, rounds: int) -> None:
    async with BenchStack() as stack:
        figures = await measure(stack, calls, rounds)
    print_table(figures, f"{calls} sequential and {calls * 2} calls 16 in flight per round, {rounds} rounds")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import uvloop

    uvloop.run(main(args.calls, args.rounds))
