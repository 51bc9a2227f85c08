"""Large outputs under a memory bound, and input patterns that cannot stall the dispatcher: a real
dispatcher, NATS, Redis and MCP servers over streamable HTTP.

- five 20 MB outputs at once under a bound that holds two of them: the calls past it wait, then
  complete, each output read back from the object store with its own sha-256 (a 2026-07-28
  server on the lean path, and a 2025-era one through the MCP SDK's session);
- an input schema's catastrophic pattern (`^(a+)+$`, 28 `a`s and a `!`) answered `invalidInput`
  at once, and one RE2 cannot run (lookaround) answered within its time bound; meanwhile another
  run's short call is answered on time.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as types
import orjson
import pytest
import pytest_asyncio

from tests.dispatcher.test_dispatcher_helpers import Harness
from tests.support.infra import aservice_process
from tests.support.mcp_servers import McpTestServer, echo_handler, echo_tools

pytestmark = pytest.mark.integration

SIZE = 20 * 1000 * 1000
BOUND = 130 * 1000 * 1000
"""Two 20 MB answers (each reserves three times its size) fit, a third waits."""


def big_text(seed: int) -> str:
    """20 MB of base64 text, different for each seed, the same each time for one seed."""
    return base64.b64encode(random.Random(seed).randbytes(SIZE * 3 // 4)).decode()


async def sizes(name: str, arguments: dict[str, Any]) -> Any:
    if name == "big":
        text = await asyncio.to_thread(big_text, int(arguments["seed"]))
        return types.CallToolResult(content=[], structured_content={"data": text})
    return await echo_handler(name, arguments)


PATTERN_TOOLS = [
    {
        "name": "nested",
        "description": "a pinned schema with a catastrophic pattern for a backtracking engine",
        "inputSchema": {"type": "object", "properties": {"q": {"type": "string", "pattern": "^(a+)+$"}}},
    },
    {
        "name": "lookahead",
        "description": "a pattern RE2 cannot run (lookahead), catastrophic for a backtracking engine",
        "inputSchema": {
            "type": "object",
            "properties": {"q": {"type": "string", "pattern": "^(?=a)(a|aa)+$"}},
        },
    },
]


BIG = [{"name": "big", "description": "20 MB", "inputSchema": {"type": "object"}}]


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def servers() -> AsyncIterator[tuple[McpTestServer, McpTestServer]]:
    async with (
        McpTestServer(BIG, sizes, name="sizes") as srv,
        McpTestServer(PATTERN_TOOLS + echo_tools(), name="patterns") as pat,
    ):
        yield srv, pat


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def legacy() -> AsyncIterator[McpTestServer]:
    async with McpTestServer(BIG, sizes, name="old", legacy=True) as srv:
        yield srv


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def h(nats_url: str, redis_url: str) -> AsyncIterator[Harness]:
    harness = Harness(nats_url, redis_url)
    await harness.connect()
    await harness.dispatcher(dispatcher_output_memory=BOUND)
    try:
        yield harness
    finally:
        await harness.close()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def hp(nats_url: str, redis_url: str) -> AsyncIterator[Harness]:
    """A dispatcher in a process of its own: a stalled event loop there does not stall the test's."""
    harness = Harness(nats_url, redis_url)
    await harness.connect()
    try:
        async with aservice_process("dispatcher", harness.env()):
            yield harness
    finally:
        await harness.close()


async def _read_back(h: Harness, ref: dict[str, Any]) -> bytes:
    assert h.nc is not None
    store = await h.nc.jetstream().object_store(ref["bucket"])
    sink = io.BytesIO()
    await store.get(ref["name"], writeinto=sink)
    return sink.getvalue()


@pytest.mark.parametrize("path", ["lean", "sdk-session"])
async def test_five_20_mb_outputs_past_the_memory_bound_wait_then_complete_intact(
    h: Harness, servers: tuple[McpTestServer, McpTestServer], legacy: McpTestServer, path: str
) -> None:
    srv = servers[0] if path == "lean" else legacy
    ts = await h.toolset({"servers": [{"name": "sizes", "url": srv.url, "tools": srv.tools}]})
    run = await h.open_run(ts)
    memory = h.apps[0].output_memory
    waits_before = memory.waits
    replies = await asyncio.gather(
        *(
            h.ok(h.subjects.calls_invoke, {"runId": run, "tool": "sizes.big", "input": {"seed": i}}, 120)
            for i in range(5)
        )
    )
    assert memory.waits - waits_before >= 3, "five answers, two fit: at least three waited"
    assert memory.peak <= BOUND and memory.used == 0
    for i, reply in enumerate(replies):
        ref = reply["outcome"]["outputRef"]
        data = await _read_back(h, ref)
        expected = orjson.dumps({"data": await asyncio.to_thread(big_text, i)})
        assert hashlib.sha256(data).hexdigest() == hashlib.sha256(expected).hexdigest() == ref["sha256"]


@pytest.mark.parametrize(
    ("tool", "value"),
    [("nested", "a" * 28 + "!"), ("lookahead", "a" * 40 + "!")],
)
async def test_a_catastrophic_pattern_is_answered_at_once_and_another_runs_call_on_time(
    hp: Harness, servers: tuple[McpTestServer, McpTestServer], tool: str, value: str
) -> None:
    h, (_, pat) = hp, servers
    ts = await h.toolset({"servers": [{"name": "pat", "url": pat.url, "tools": pat.tools}]})
    slow_run, other_run = await h.open_run(ts), await h.open_run(ts)
    await h.invoke(other_run, "pat.echo", {"text": "warm"})

    async def timed(run: str, name: str, inp: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        start = time.monotonic()
        reply = await h.request(h.subjects.calls_invoke, {"runId": run, "tool": name, "input": inp}, 60)
        return time.monotonic() - start, reply

    pattern_call = asyncio.create_task(timed(slow_run, f"pat.{tool}", {"q": value}))
    await asyncio.sleep(0.1)  # the pattern call is being checked (for as long as it takes)
    other_took, other = await timed(other_run, "pat.echo", {"text": "on time"})
    took, reply = await pattern_call
    assert other["data"]["outcome"] == {"status": "ok", "output": {"text": "on time"}}
    assert other_took < 2.0, f"another run's call waited {other_took:.1f} s"
    assert not reply["ok"] and reply["error"]["code"] == "invalidInput", reply
    assert reply["error"]["details"]["path" if tool == "nested" else "pattern"]
    assert took < 2.0, f"the pattern call took {took:.1f} s"
