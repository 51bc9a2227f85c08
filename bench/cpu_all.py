"""Where a call's CPU goes across every process on its path, beside the direct call's processes in
the same run: `calls.invoke` of `echo.echo` (16 in flight, one dispatcher) against toolbus's own
`McpConnection` calling the same MCP server directly, in alternating rounds. Runs its own
nats-server (JetStream, file storage in a temporary directory) and redis-server on free ports
(`bench/servers.py`), so their CPU is this bench's alone. Per process: user + system CPU from
/proc/<pid>/stat over the round, divided by the round's calls. Beside it, for the invoke rounds:
Redis `INFO commandstats` deltas (calls and µs per call of each command), NATS messages and bytes
per call (`/varz`), and the EVENTS stream's storage settings and size.

    uv run python bench/cpu_all.py [--calls 3000] [--rounds 3]

On 2 cores, throughput with 16 in flight is bounded by the total CPU per call of all processes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redis.asyncio import Redis
from toolbus_common.settings import stream_name
from toolbus_mcp_client import McpConnection

from bench.harness import Call, commit, cpu_seconds, in_flight
from bench.servers import PrivateServers
from bench.stack import BenchStack

ORDER = ("client (bench)", "nats-server", "redis-server", "dispatcher", "registry", "MCP server")


def snapshot(pids: dict[str, int]) -> dict[str, float]:
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


async def commandstats(redis: Redis[bytes]) -> dict[str, tuple[int, float]]:
    """{command: (calls, usec)} from INFO commandstats."""
    info: dict[str, Any] = await redis.info("commandstats")
    out: dict[str, tuple[int, float]] = {}
    for key, value in info.items():
        name = key.removeprefix("cmdstat_")
        out[name] = (int(value["calls"]), float(value["usec"]))
    return out


async def round_of(call: Call, n: int, pids: dict[str, int]) -> tuple[float, dict[str, float]]:
    before = snapshot(pids)
    _, rate, _ = await in_flight(call, n)
    after = snapshot(pids)
    return rate, {name: (after[name] - before[name]) / n for name in pids}


def upper_median(values: list[float]) -> float:
    """The middle value, the larger of the two middle ones for an even count (of two rounds:
    the larger)."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


async def main(calls: int, rounds: int) -> None:
    with PrivateServers() as servers:
        async with BenchStack(
            ("registry", "dispatcher"), nats_url=servers.nats_url, redis_url=servers.redis_url
        ) as stack:
            assert stack.mcp is not None
            pids = {
                "client (bench)": os.getpid(),
                **servers.pids(),
                "dispatcher": stack.services["dispatcher"].proc.pid,
                "registry": stack.services["registry"].proc.pid,
                "MCP server": stack.mcp.pid,
            }
            conn = await McpConnection.open(stack.url, {}, server_name="echo")
            redis: Redis[bytes] = Redis.from_url(servers.redis_url)

            async def direct() -> object:
                result = await conn.call_tool(
                    "echo", {"text": "hi"}, idempotency_key=uuid.uuid4().hex, timeout=30
                )
                assert not result.is_error
                return result

            try:
                await in_flight(stack.invoke, 1000)  # warm
                await in_flight(direct, 500)
                print(f"commit {commit()['commit']}; {calls} calls a round, 16 in flight, {rounds} rounds")
                got: dict[str, list[tuple[float, dict[str, float]]]] = {"direct": [], "invoke": []}
                stats: list[dict[str, tuple[float, float]]] = []
                msgs: list[dict[str, float]] = []
                for _ in range(rounds):
                    got["direct"].append(await round_of(direct, calls, pids))
                    cs0 = await commandstats(redis)
                    v0 = servers.varz()
                    got["invoke"].append(await round_of(stack.invoke, calls, pids))
                    v1 = servers.varz()
                    cs1 = await commandstats(redis)
                    stats.append(
                        {
                            name: (
                                (c - cs0.get(name, (0, 0.0))[0]) / calls,
                                (u - cs0.get(name, (0, 0.0))[1]) / calls,
                            )
                            for name, (c, u) in cs1.items()
                            if c != cs0.get(name, (0, 0.0))[0]
                        }
                    )
                    msgs.append(
                        {k: (v1[k] - v0[k]) / calls for k in ("in_msgs", "out_msgs", "in_bytes", "out_bytes")}
                    )
                print_processes(got)
                print_redis(stats)
                print_nats(msgs)
                await print_stream(stack)
            finally:
                await conn.aclose()
                await redis.aclose()


def print_processes(got: dict[str, list[tuple[float, dict[str, float]]]]) -> None:
    print()
    print("CPU per call, µs (upper median of the rounds; each round's figures after the slash)")
    print(f"{'process':<16} {'direct McpConnection':>28} {'calls.invoke':>40}")
    for name in ORDER:
        cells = []
        for path in ("direct", "invoke"):
            values = [per[name] * 1e6 for _, per in got[path]]
            cells.append(f"{upper_median(values):6.0f} / " + " ".join(f"{v:.0f}" for v in values))
        print(f"{name:<16} {cells[0]:>28} {cells[1]:>40}")
    for label, fn in (("total", sum), ("calls/s", None)):
        cells = []
        for path in ("direct", "invoke"):
            if fn is None:
                values = [rate for rate, _ in got[path]]
            else:
                values = [fn(per.values()) * 1e6 for _, per in got[path]]
            cells.append(f"{upper_median(values):6.0f} / " + " ".join(f"{v:.0f}" for v in values))
        print(f"{label:<16} {cells[0]:>28} {cells[1]:>40}")


def print_redis(stats: list[dict[str, tuple[float, float]]]) -> None:
    print()
    print("Redis INFO commandstats per calls.invoke (invoke rounds; upper median): calls, µs in Redis")
    names = sorted(
        {n for s in stats for n in s}, key=lambda n: -upper_median([s.get(n, (0, 0))[1] for s in stats])
    )
    total_calls = total_us = 0.0
    for name in names:
        c = upper_median([s.get(name, (0, 0))[0] for s in stats])
        u = upper_median([s.get(name, (0, 0))[1] for s in stats])
        total_calls += c
        total_us += u
        if c >= 0.005:
            print(f"  {name:<22} {c:6.2f} calls  {u:7.1f} µs  ({u / c if c else 0:.1f} µs each)")
    print(f"  {'total':<22} {total_calls:6.2f} calls  {total_us:7.1f} µs")


def print_nats(msgs: list[dict[str, float]]) -> None:
    print()
    print("nats-server /varz per calls.invoke (invoke rounds; upper median)")
    for key in ("in_msgs", "out_msgs", "in_bytes", "out_bytes"):
        print(f"  {key:<10} {upper_median([m[key] for m in msgs]):8.1f}")


async def print_stream(stack: BenchStack) -> None:
    js = stack.nc.jetstream()
    info = await js.stream_info(stream_name(stack.prefix, "EVENTS"))
    cfg = info.config
    print()
    print(
        f"EVENTS stream: storage {cfg.storage}, replicas {cfg.num_replicas}, duplicate window"
        f" {cfg.duplicate_window} s, max_age {cfg.max_age} s; {info.state.messages} messages,"
        f" {info.state.bytes / max(1, info.state.messages):.0f} bytes each"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    asyncio.run(main(a.calls, a.rounds))
