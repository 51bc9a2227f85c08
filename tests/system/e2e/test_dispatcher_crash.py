"""A dispatcher killed with SIGKILL in the middle of calls: a second dispatcher process claims
them when their lease lapses; the `retry` call is sent again with the same idempotency key and
answers the waiting invoker, the `at_most_once` call ends `outcomeUnknown`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.dispatcher.test_dispatcher_helpers import Harness, wait_until
from tests.support.bus_modes import Bus
from tests.support.mcp_servers import McpTestServer, echo_tools

pytestmark = pytest.mark.e2e


@pytest_asyncio.fixture(loop_scope="session")
async def h(bus: Bus, redis_url: str) -> AsyncIterator[Harness]:
    # The calls as `harness`; the pinned toolset written as the registry, which owns the store.
    harness = Harness(
        bus.nats_url,
        redis_url,
        prefix=bus.prefix("tbd"),
        connect_options=bus.connect_options("harness"),
        store_connect_options=bus.connect_options("registry") if bus.secured else None,
    )
    await harness.connect()
    try:
        yield harness
    finally:
        await harness.close()


async def test_calls_of_a_killed_dispatcher_are_finished_by_another(h: Harness, bus: Bus) -> None:
    async with McpTestServer(name="slow") as server:
        server.call_delay = 0.8
        tools = [{k: t[k] for k in ("name", "inputSchema") if k in t} for t in echo_tools()]
        ts = await h.toolset(
            {
                "servers": [
                    {"name": "again", "url": server.url, "tools": tools},
                    {
                        "name": "once",
                        "url": server.url,
                        "tools": tools,
                        "policies": {"echo": {"onInterruption": "at_most_once"}},
                    },
                ]
            }
        )
        async with bus.service("dispatcher", h.env()) as first:
            run = await h.open_run(ts)
            retry = asyncio.create_task(h.invoke(run, "again.echo", {"text": "r"}, idempotencyKey="crash-r"))
            once = asyncio.create_task(h.invoke(run, "once.echo", {"text": "o"}, idempotencyKey="crash-o"))
            await wait_until(lambda: len(server.calls) >= 2, what="both calls to reach the server")
            first.kill()
        async with bus.service("dispatcher", h.env()):
            retried, unknown = await asyncio.gather(retry, once)
            got = await h.ok(h.subjects.calls_get, {"callId": retried["callId"]})
    assert retried["outcome"] == {"status": "ok", "output": {"text": "r"}}
    assert unknown["outcome"]["status"] == "error"
    assert unknown["outcome"]["error"]["code"] == "outcomeUnknown"
    keys = [c.idempotency_key_header for c in server.calls]
    assert keys.count("crash-r") == 2
    assert keys.count("crash-o") == 1
    assert got["state"] == "done" and got["attempts"] == 2
