"""`calls.invoke` replies that cannot be sent as built, through a real dispatcher, real NATS and
Redis and an MCP server over streamable HTTP: every invoker waiting on the call gets exactly one
reply, an error reply where the built one could not go.

- too large for a NATS message (the inline limit forced above the server's max_payload past the
  clamp the dispatcher applies to its setting): each waiting invoker gets `outputTooLarge`;
- the publish fails (the connection's buffer is full while reconnecting): that invoker gets
  `unavailable` (sent once more), the others their outcome.
A connection that is gone cannot answer at all; the outcome is stored and `calls.get` serves it.

And the setting itself: `TOOLBUS_DISPATCHER_INLINE_OUTPUT_BYTES` above what fits is lowered at
start (a warning), so that the `completed` event of a large output goes by reference and reaches
the stream instead of being refused by JetStream for ever."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as types
import nats.errors
import pytest
import pytest_asyncio
from nats.aio.msg import Msg
from toolbus_dispatcher.outputs import ENVELOPE_ROOM

from tests.dispatcher.test_dispatcher_helpers import Harness, wait_until
from tests.support.infra import js_name
from tests.support.mcp_servers import McpTestServer

pytestmark = pytest.mark.integration

BLOB = 1_500_000  # over the NATS server's max_payload (1 MiB) once in a reply
TOOLS = [{"name": n, "description": n, "inputSchema": {"type": "object"}} for n in ("blob", "small")]


async def handler(name: str, arguments: dict[str, Any]) -> Any:
    if name == "blob":
        return types.CallToolResult(content=[], structured_content={"data": "b" * BLOB})
    return {"small": True}


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def mcp() -> AsyncIterator[McpTestServer]:
    async with McpTestServer(TOOLS, handler, name="sizes") as srv:
        yield srv


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def h(nats_url: str, redis_url: str) -> AsyncIterator[Harness]:
    harness = Harness(nats_url, redis_url)
    await harness.connect()
    # Outputs up to 4 MiB inline: a reply can then be built larger than one NATS message. The
    # setting is clamped to what fits; the limit is forced past it here to reach the reply guard.
    app = await harness.dispatcher(dispatcher_inline_output_bytes=4 * 1024 * 1024)
    assert app.outputs is not None and app.outputs.inline_limit < 1024 * 1024
    app.outputs.inline_limit = 4 * 1024 * 1024
    try:
        yield harness
    finally:
        await harness.close()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def run(h: Harness, mcp: McpTestServer) -> str:
    ts = await h.toolset({"servers": [{"name": "sizes", "url": mcp.url, "tools": TOOLS}]})
    return await h.open_run(ts)


async def _invokers(h: Harness, run: str, tool: str, n: int) -> tuple[list[str], dict[str, list[Msg]]]:
    """`n` invokers of one call (one idempotency key), each on an inbox of its own; the call is held
    by the server's delay until all of them wait on it."""
    assert h.nc is not None
    got: dict[str, list[Msg]] = {}
    inboxes = []
    key = uuid.uuid4().hex
    for _ in range(n):
        inbox = h.nc.new_inbox()
        got[inbox] = []

        async def on(msg: Msg, into: list[Msg] = got[inbox]) -> None:
            into.append(msg)

        await h.nc.subscribe(inbox, cb=on)
        inboxes.append(inbox)
    body = json.dumps({"runId": run, "tool": tool, "input": {}, "idempotencyKey": key}).encode()
    for inbox in inboxes:
        await h.nc.publish(h.subjects.calls_invoke, body, reply=inbox)
    await h.nc.flush()
    return inboxes, got


async def _settled(h: Harness, got: dict[str, list[Msg]]) -> list[dict[str, Any]]:
    """Each inbox's replies once every inbox has one; a later round trip through the dispatcher
    (every reply of the call was published before) shows no second reply came."""
    await wait_until(lambda: all(got.values()), what="every invoker answered", within=30)
    await h.request(h.subjects.calls_get, {"callId": "call_" + "0" * 32})  # a round trip
    assert h.nc is not None
    await h.nc.flush()
    assert [len(v) for v in got.values()] == [1] * len(got)
    return [json.loads(v[0].data) for v in got.values()]


async def test_a_reply_too_large_for_a_nats_message_is_output_too_large_for_every_invoker(
    h: Harness, run: str, mcp: McpTestServer
) -> None:
    mcp.call_delay = 1.0
    try:
        _, got = await _invokers(h, run, "sizes.blob", 3)
        replies = await _settled(h, got)
    finally:
        mcp.call_delay = 0.0
    for reply in replies:
        assert reply["ok"] is False and reply["error"]["code"] == "outputTooLarge", str(reply)[:300]


async def test_a_reply_whose_publish_fails_is_unavailable_for_that_invoker_only(
    h: Harness, run: str, mcp: McpTestServer
) -> None:
    bus_nc = h.apps[0].bus.nc
    real_publish = bus_nc.publish
    failed: list[str] = []
    doomed: set[str] = set()

    async def publish(subject: str, payload: bytes = b"", *args: Any, **kw: Any) -> None:
        if subject in doomed and subject not in failed:
            failed.append(subject)
            raise nats.errors.OutboundBufferLimitError
        await real_publish(subject, payload, *args, **kw)

    mcp.call_delay = 1.0
    bus_nc.publish = publish  # type: ignore[method-assign]
    try:
        inboxes, got = await _invokers(h, run, "sizes.small", 3)
        doomed.add(inboxes[1])
        replies = await _settled(h, got)
    finally:
        bus_nc.publish = real_publish  # type: ignore[method-assign]
        mcp.call_delay = 0.0
    assert failed == [inboxes[1]]
    by_inbox = dict(zip(got, replies, strict=True))
    failed_reply = by_inbox.pop(inboxes[1])
    assert failed_reply["ok"] is False and failed_reply["error"]["code"] == "unavailable"
    for reply in by_inbox.values():
        assert reply["ok"] is True and reply["data"]["outcome"] == {"status": "ok", "output": {"small": True}}


async def test_an_inline_limit_above_what_fits_is_clamped_and_the_completed_event_reaches_the_stream(
    nats_url: str, redis_url: str, mcp: McpTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    harness = Harness(nats_url, redis_url)
    await harness.connect()
    try:
        with caplog.at_level(logging.WARNING, logger="toolbus_dispatcher.app"):
            app = await harness.dispatcher(dispatcher_inline_output_bytes=64 * 1024 * 1024)
        assert harness.nc is not None and app.outputs is not None
        assert app.outputs.inline_limit == harness.nc.max_payload - ENVELOPE_ROOM
        clamped = [r for r in caplog.records if "INLINE_OUTPUT_BYTES" in r.getMessage()]
        assert len(clamped) == 1
        ts = await harness.toolset({"servers": [{"name": "sizes", "url": mcp.url, "tools": TOOLS}]})
        run = await harness.open_run(ts)
        data = await harness.invoke(run, "sizes.blob", {})
        ref = data["outcome"]["outputRef"]
        assert data["outcome"]["status"] == "ok" and ref["size"] > BLOB
        relay = app.relay
        assert relay is not None
        await wait_until(lambda: _outbox_empty(relay), what="the outbox relayed")
        completed = await _completed_event(harness, run, data["callId"])
        assert completed["outcome"] == data["outcome"]
    finally:
        await harness.close()


async def _outbox_empty(relay: Any) -> bool:
    return int(await relay.pending()) == 0


async def _completed_event(h: Harness, run: str, call_id: str) -> dict[str, Any]:
    assert h.nc is not None
    sub = await h.nc.jetstream().subscribe(
        h.subjects.call_events(run, call_id), stream=js_name(h.prefix, "EVENTS"), ordered_consumer=True
    )
    try:
        while True:
            msg = await sub.next_msg(timeout=10)
            body: dict[str, Any] = json.loads(msg.data)
            if body["type"] == "completed":
                return body
    finally:
        await sub.unsubscribe()
