"""Do the hand-written protocol clients earn their place? Side by side in one run, on the hot path's
actual operations:

- MCP: the same `tools/call` POST (the bytes and headers `McpConnection` builds for an `echo` call,
  answered (JSON, as a 2026-07-28 server does) by the MCP test server in its own process) through toolbus's
  `_http1.Http1Pool`, aiohttp's client, and httpx2 (the SDK's HTTP stack, through `_fast_call`'s
  `post_request`, as toolbus falls back to it);
- Redis: the dispatcher's two hot-path Lua scripts per call (`create_call.lua` + `finish_call.lua`,
  real keys and arguments through `CallStore`, see `bench/semaphore.py`) through toolbus's
  `ScriptPipe`, redis-py with hiredis, redis-py with its pure-Python parser, coredis and
  valkey-glide.

Each row: p50/p99 latency, calls/s and this process's CPU per call (the client's cost: servers run
elsewhere), sequentially and with 16 in flight; and the difference to toolbus's own client.

    make bench-alternatives ARGS="--calls 2000 --rounds 2"

which runs it in a venv of its own (`.cache/bench-venv`, the locked `bench-alternatives` group on top
of the project's): with aiohttp installed nats-py imports it, and the services' RSS would grow.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import Row, in_flight, merge, percentile, sequential, start_mcp_server
from bench.semaphore import ScriptStack

REDIS_URL = os.environ.get("TOOLBUS_REDIS_URL", "redis://127.0.0.1:6379/0")
Call = Callable[[], Awaitable[object]]


# ---- MCP POSTs --------------------------------------------------------------------------------------


def answer_result(content_type: str, body: bytes) -> dict[str, Any]:
    """The JSON-RPC result of a JSON or SSE answer read whole (what aiohttp gives a caller)."""
    if content_type.startswith("application/json"):
        result: dict[str, Any] = orjson.loads(body)["result"]
        return result
    for line in body.decode().splitlines():
        if line.startswith("data:"):
            message = orjson.loads(line[5:])
            if "result" in message:
                found: dict[str, Any] = message["result"]
                return found
    raise RuntimeError(f"no result in the answer: {body[:200]!r}")


async def mcp_clients(url: str) -> tuple[dict[str, Call], Callable[[], Awaitable[None]]]:
    import aiohttp
    from toolbus_mcp_client import IDEMPOTENCY_META_KEY, McpConnection
    from toolbus_mcp_client._fast_call import build_call, post_request
    from toolbus_mcp_client._http1 import Http1Pool

    conn = await McpConnection.open(url, {}, server_name="echo")
    assert conn._live is not None
    assert conn._live.client is not None
    body, mcp_headers = build_call(
        conn._live.client.session._stamp,
        1,
        "echo",
        {"text": "hi"},
        {IDEMPOTENCY_META_KEY: uuid.uuid4().hex},
        None,
    )
    base = conn._lean_headers()
    pool = Http1Pool(url, base, None)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100), auto_decompress=False)
    merged = {**base, **mcp_headers}

    async def own() -> object:
        result = await pool.post(body, mcp_headers, 1, None)
        assert result["structuredContent"] is not None or result["content"], result
        return result

    async def aio() -> object:
        async with session.post(url, data=body, headers=merged) as response:
            assert response.status == 200, response.status
            return answer_result(response.content_type, await response.read())

    async def httpx2_path() -> object:
        return await post_request(conn._http, url, body, mcp_headers, 1)

    async def close() -> None:
        pool.close()
        await session.close()
        await conn.aclose()

    return {
        "toolbus _http1.Http1Pool": own,
        "aiohttp ClientSession": aio,
        "httpx2 (SDK stack)": httpx2_path,
    }, close


# ---- Redis scripts ---------------------------------------------------------------------------------


class RedisPy:
    """`evalsha` on a redis-py asyncio client (its pool, its parser)."""

    def __init__(self, hiredis: bool) -> None:
        from redis._parsers import _AsyncHiredisParser, _AsyncRESP2Parser
        from redis.asyncio import Redis

        parser = _AsyncHiredisParser if hiredis else _AsyncRESP2Parser
        self.client: Any = Redis.from_url(REDIS_URL, parser_class=parser)

    async def evalsha(self, sha: str, keys: list[str], args: list[Any]) -> Any:
        return await self.client.evalsha(sha, len(keys), *keys, *args)

    async def aclose(self) -> None:
        await self.client.aclose()


class Coredis:
    def __init__(self) -> None:
        import coredis

        self.client: Any = coredis.Redis.from_url(REDIS_URL)

    async def open(self) -> Coredis:
        await self.client.__aenter__()  # coredis 6 runs its pool in the client's context
        return self

    async def evalsha(self, sha: str, keys: list[str], args: list[Any]) -> Any:
        return await self.client.evalsha(sha, keys=keys, args=[str(a) for a in args])

    async def aclose(self) -> None:
        await self.client.__aexit__(None, None, None)


class Glide:
    def __init__(self) -> None:
        self.client: Any = None

    async def open(self) -> Glide:
        from urllib.parse import urlsplit

        from glide import GlideClient, GlideClientConfiguration, NodeAddress

        parts = urlsplit(REDIS_URL)
        config = GlideClientConfiguration(
            [NodeAddress(parts.hostname or "127.0.0.1", parts.port or 6379)],
            database_id=int(parts.path.lstrip("/") or 0),
        )
        self.client = await GlideClient.create(config)
        return self

    async def evalsha(self, sha: str, keys: list[str], args: list[Any]) -> Any:
        return await self.client.custom_command(
            ["EVALSHA", sha, str(len(keys)), *keys, *(str(a) for a in args)]
        )

    async def aclose(self) -> None:
        await self.client.close()


async def redis_clients() -> tuple[dict[str, Call], Callable[[], Awaitable[None]]]:
    from redis.asyncio import Redis
    from toolbus_common.script_pipe import ScriptPipe

    admin: Any = Redis.from_url(REDIS_URL)
    made: list[tuple[str, Any]] = [
        ("toolbus script_pipe.ScriptPipe", ScriptPipe(REDIS_URL)),
        ("redis-py + hiredis", RedisPy(hiredis=True)),
        ("redis-py, pure-Python parser", RedisPy(hiredis=False)),
    ]
    notes: dict[str, str] = {}
    try:
        made.append(("coredis", await Coredis().open()))
    except ImportError as exc:
        notes["coredis"] = str(exc)
    try:
        made.append(("valkey-glide", await Glide().open()))
    except ImportError as exc:
        notes["valkey-glide"] = str(exc)
    stacks = [(name, await ScriptStack(pipe, admin).open()) for name, pipe in made]
    for name, why in notes.items():
        print(f"{name}: not measured ({why})")

    async def close() -> None:
        for _, stack in stacks:
            await stack.close()
            await stack.pipe.aclose()
        await admin.aclose()

    return {name: stack.acquire_release for name, stack in stacks}, close


# ---- the table -------------------------------------------------------------------------------------


async def compare(title: str, clients: dict[str, Call], calls: int, rounds: int) -> list[dict[str, Any]]:
    for fn in clients.values():  # warm up: connections open, caches filled
        await sequential(fn, 200)
        await in_flight(fn, 200)
    got: dict[tuple[str, str], list[Row]] = {}
    order = list(clients.items())
    for _ in range(rounds):
        for name, fn in order:
            got.setdefault((name, "sequential"), []).append(await sequential(fn, calls))
        for name, fn in order:
            got.setdefault((name, "16 in flight"), []).append(await in_flight(fn, calls))
        order.reverse()  # the next round in the other order, so drift shows
    rows = []
    own = next(iter(clients))
    print(f"\n{title}: {calls} calls per row and round, {rounds} rounds")
    print(
        f"{'mode':<14}{'client':<32}{'p50 ms':>8}{'p99 ms':>8}{'calls/s':>9}{'CPU ms/call':>13}{'p50 vs own':>12}{'CPU vs own':>12}"
    )
    for mode in ("sequential", "16 in flight"):
        own_lat, _, own_cpu = merge(got[(own, mode)])
        own_p50 = percentile(own_lat, 0.5)
        for name in clients:
            lat, rate, cpu = merge(got[(name, mode)])
            p50, p99 = percentile(lat, 0.5), percentile(lat, 0.99)
            row = {
                "what": title,
                "mode": mode,
                "client": name,
                "p50_ms": p50 * 1e3,
                "p99_ms": p99 * 1e3,
                "calls_per_s": rate,
                "cpu_ms_per_call": cpu * 1e3,
                "p50_minus_own_ms": (p50 - own_p50) * 1e3,
                "cpu_minus_own_ms": (cpu - own_cpu) * 1e3,
            }
            rows.append(row)
            print(
                f"{mode:<14}{name:<32}{row['p50_ms']:>8.3f}{row['p99_ms']:>8.3f}{rate:>9.0f}{row['cpu_ms_per_call']:>13.3f}"
                f"{row['p50_minus_own_ms']:>+12.3f}{row['cpu_minus_own_ms']:>+12.3f}"
            )
    return rows


async def main(calls: int, rounds: int, json_path: str | None) -> None:
    from bench.harness import commit

    info = commit()
    print(
        f"commit {info['commit']}{' (dirty)' if info['dirty'] else ''}; a shared 2-core machine: read the differences"
    )
    proc, url = start_mcp_server()
    rows = []
    try:
        clients, close = await mcp_clients(url)
        try:
            rows += await compare("MCP tools/call POST (echo, JSON answer)", clients, calls, rounds)
        finally:
            await close()
    finally:
        proc.terminate()
        proc.wait(10)
    clients, close = await redis_clients()
    try:
        rows += await compare(
            "dispatcher Lua scripts per call (create_call + finish)", clients, calls, rounds
        )
    finally:
        await close()
    if json_path:
        Path(json_path).write_bytes(orjson.dumps({**info, "rows": rows}, option=orjson.OPT_INDENT_2))  # noqa: ASYNC240


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    import uvloop

    uvloop.run(main(args.calls, args.rounds, args.json))
