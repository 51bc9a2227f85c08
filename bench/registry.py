"""Registration time of a toolset of 10 servers x 100 tools served locally, beside the time of
just listing those servers' tools with the MCP client, in the same run: the bare SDK client (the
baseline) and toolbus's own `McpConnection` (what the registry lists with), all concurrently.

Then the figure that can be judged on a noisy machine: `--pairs` interleaved pairs, each a listing
with `McpConnection` followed at once by the registration of a toolset not seen before (the same
servers under fresh names), the background embedding of earlier toolsets stopped before each pair
(every registration here is of new texts, so otherwise one to five toolsets are being embedded at
each create). It reports the median of the per-pair ratios with its spread, and the process's CPU
time per registration against the listing's (the registry runs in this process; the bench's own
share of a create is one NATS request).

    uv run python bench/registry.py [--rounds 10] [--pairs 20] [--json]

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

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from toolbus_common import Settings
from toolbus_common.runtime import tune_gc
from toolbus_devstack import DEV_EGRESS_ALLOW
from toolbus_mcp_client import McpConnection
from toolbus_registry.app import RegistryApp

from bench.harness import Figure, print_table, start_mcp_servers, stop_processes

SECTION = "registration"

SERVERS, TOOLS = 10, 100


def serve(count: int, prefix: str, tools: int = TOOLS) -> tuple[list[subprocess.Popen[str]], list[str]]:
    """`count` MCP servers of `tools` synthetic tools each, in their own processes."""
    started = start_mcp_servers([(tools, f"{prefix}{i}") for i in range(count)])
    return [proc for proc, _ in started], [url for _, url in started]


def _transport_error(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(_transport_error(e) for e in exc.exceptions)
    return isinstance(exc, httpx2.TransportError)


async def list_all_sdk(urls: list[str], https: list[httpx2.AsyncClient]) -> int:
    """The baseline: each server listed to the end by a bare `mcp.Client`, opened for the listing
    (as a registration opens its connections) on that server's reused HTTP client."""

    async def one(url: str, http: httpx2.AsyncClient) -> int:
        async with Client(streamable_http_client(url, http_client=http), mode="auto") as client:
            count, cursor = 0, None
            while True:
                page = await client.list_tools(cursor=cursor, cache_mode="refresh")
                count += len(page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    return count

    async def retried(url: str, http: httpx2.AsyncClient) -> int:
        # A keep-alive connection the server closed while the client held it idle fails the
        # next request with ReadError (seen once in a `make bench` run); the baseline is the
        # listing, not that race, so it is listed once more on a fresh connection.
        try:
            return await one(url, http)
        except Exception as exc:  # the SDK raises it inside an ExceptionGroup of its task group
            if not _transport_error(exc):
                raise
            return await one(url, http)

    return sum(await asyncio.gather(*(retried(u, h) for u, h in zip(urls, https, strict=True))))


async def list_all(urls: list[str]) -> int:
    """Each server listed by toolbus's own client (`McpConnection`), as the registry lists."""

    async def one(i: int, url: str) -> int:
        conn = await McpConnection.open(url, {}, server_name=f"srv{i}")
        try:
            return len(await conn.list_tools())
        finally:
            await conn.aclose()

    return sum(await asyncio.gather(*(one(i, u) for i, u in enumerate(urls))))


def spread(values: list[float]) -> str:
    """`p25-p75 (min-max)` of `values`, two decimals."""
    ordered = sorted(values)
    if len(ordered) < 2:
        return f"{ordered[0]:.2f}" if ordered else "-"
    q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    return f"p25-p75 {q1:.2f}-{q3:.2f}, min-max {ordered[0]:.2f}-{ordered[-1]:.2f}"


async def measure(
    rounds: int, servers: int = SERVERS, tools: int = TOOLS, pairs: int | None = None
) -> list[Figure]:
    """Registration figures (medians of `rounds`) beside listing with toolbus's client, for a
    toolset of `servers` MCP servers of `tools` tools each (plus each server's echo tools); then
    `pairs` (default 2 x `rounds`) interleaved listing / not-seen-before registration pairs."""
    pairs = 2 * rounds if pairs is None else pairs
    prefix = f"tbbench{uuid.uuid4().hex[:8]}"
    settings = Settings(
        subject_prefix=prefix,
        nats_url=os.environ.get("TOOLBUS_NATS_URL", "nats://127.0.0.1:4222"),
        egress_allow=os.environ.get("TOOLBUS_EGRESS_ALLOW", DEV_EGRESS_ALLOW),  # its servers: loopback
    )
    procs, urls = serve(servers, "s", tools)
    app = RegistryApp(settings)
    await app.start()
    tune_gc()  # as `python -m toolbus_registry` does once started
    import nats

    nc = await nats.connect(settings.nats_url)

    def spec(names: str) -> bytes:
        return orjson.dumps({"mcp": [{"name": f"{names}{i}", "url": u} for i, u in enumerate(urls)]})

    async def create(body: bytes) -> float:
        t = time.perf_counter()
        reply = orjson.loads((await nc.request(settings.subjects.toolsets_create, body, timeout=60)).data)
        took = time.perf_counter() - t
        assert reply["ok"], reply
        return took

    async def no_embedding() -> None:
        """Let the registrations' background warming start, then stop the embedding it started
        and wait for its thread's chunk: no background work in the registry after this."""
        service = app.service
        assert service is not None
        # Registries from before `warmed` / `settled` (this bench run with an older checkout's
        # interpreter) are waited for through the same private state those methods read.
        warmed = getattr(service, "warmed", None)
        if warmed is not None:
            await warmed()
        else:
            await asyncio.gather(*service._warming.values(), return_exceptions=True)
        await service.searcher.close()
        settled = getattr(service.searcher.embedder, "settled", None)
        if settled is not None:
            await settled()
        else:
            await asyncio.get_running_loop().run_in_executor(
                service.searcher.embedder._background, lambda: None
            )

    body = spec("srv")
    https = [create_mcp_http_client() for _ in urls]
    try:
        # warm every path once (imports, first connections, first store write)
        await list_all_sdk(urls, https)
        await list_all(urls)
        await create(body)
        sdk_listing, listing, again, new = [], [], [], []
        for r in range(rounds):
            t = time.perf_counter()
            count = await list_all_sdk(urls, https)
            sdk_listing.append(time.perf_counter() - t)
            t = time.perf_counter()
            await list_all(urls)
            listing.append(time.perf_counter() - t)
            again.append(await create(body))
            # the same servers under other names: a toolset the registry has not seen (pinned,
            # stored, tool table and reply built), listed from servers as warm as above
            new.append(await create(spec(f"r{r}srv")))
            # a new toolset's declarations are rendered and its search index built in the
            # background after the reply: let that finish before the next timings
            await asyncio.sleep(0.5)
        ratios, cpu_create, cpu_listing, pair_new, pair_listing = [], [], [], [], []
        for r in range(pairs):
            await no_embedding()
            c, t = time.process_time(), time.perf_counter()
            await list_all(urls)
            pair_listing.append(time.perf_counter() - t)
            cpu_listing.append(time.process_time() - c)
            c = time.process_time()
            pair_new.append(await create(spec(f"p{r}srv")))
            cpu_create.append(time.process_time() - c)
            ratios.append(pair_new[-1] / pair_listing[-1])
    finally:
        for http in https:
            await http.aclose()
        await no_embedding()  # else the last toolset's embedding reads a store being closed
        await app.stop()
        stop_processes(procs)
        js = nc.jetstream()
        for bucket in ("toolsets", "workflows", "embeddings"):
            for kind in ("OBJ_", "KV_"):
                with contextlib.suppress(Exception):
                    await js.delete_stream(kind + settings.js_name(bucket))
        await nc.close()

    ours = statistics.median(listing) * 1e3
    what = f"{servers} servers x {tools} tools ({count} tools)"
    base = "list them directly: toolbus McpConnection"
    return [
        Figure(
            SECTION, f"list {what}: bare mcp.Client", statistics.median(sdk_listing) * 1e3, "ms", base, ours
        ),
        Figure(
            SECTION, f"toolsets.create {what}, seen before", statistics.median(again) * 1e3, "ms", base, ours
        ),
        Figure(
            SECTION,
            f"toolsets.create {what}, not seen before",
            statistics.median(new) * 1e3,
            "ms",
            base,
            ours,
        ),
        Figure(
            SECTION,
            f"toolsets.create {what}, not seen before / listing, {pairs} interleaved pairs: median ratio",
            statistics.median(ratios),
            "x",
            note=spread(ratios),
        ),
        Figure(
            SECTION,
            f"registry CPU per toolsets.create, not seen before, {pairs} pairs: median",
            statistics.median(cpu_create) * 1e3,
            "ms",
            "CPU of listing them directly (same pairs)",
            statistics.median(cpu_listing) * 1e3,
            note=f"wall: registration {statistics.median(pair_new) * 1e3:.1f} ms, "
            f"listing {statistics.median(pair_listing) * 1e3:.1f} ms (medians of the pairs)",
        ),
    ]


async def main(rounds: int, pairs: int, as_json: bool) -> None:
    figures = await measure(rounds, pairs=pairs)
    if as_json:
        print(orjson.dumps([f.as_json() for f in figures]).decode())
    else:
        print_table(figures, f"registration, medians of {rounds} rounds and {pairs} pairs")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--pairs", type=int, default=20, help="interleaved listing/registration pairs")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.pairs, args.json))
