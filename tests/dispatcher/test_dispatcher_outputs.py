"""Outputs of any size through a real dispatcher, real NATS, Redis, MCP servers over streamable
HTTP (one speaking 2026-07-28, which the dispatcher calls on its fast path, and one speaking only
the 2025 protocol, called through a 2025-11-25 session and the MCP SDK's transport) and an HTTP
server: a 50 MB output (MCP on both paths, and http.fetch) comes back by reference
(`outputRef` in the invoke reply, in calls.get and in the `completed` event of the stream) and
reads back byte for byte from the object store; one over the cap ends `outputTooLarge` without
the body being read; a small output stays inline; 1,000 calls.get in flight all answer."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import json
import os
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import mcp_types as types
import orjson
import pytest
import pytest_asyncio

from tests.dispatcher.test_dispatcher_helpers import Harness
from tests.support.http_servers import serve_in_thread
from tests.support.infra import js_name
from tests.support.mcp_servers import McpTestServer

pytestmark = pytest.mark.integration

CAP = 56 * 1024 * 1024
BIG = 50 * 1000 * 1000
BIG_TEXT = base64.b64encode(os.urandom(BIG * 3 // 4)).decode()  # 50 MB of text, unique bytes
assert len(BIG_TEXT) == BIG
BIG_BYTES = os.urandom(BIG)
OVER = CAP + 1024


async def handler(name: str, arguments: dict[str, Any]) -> Any:
    if name == "big":
        return types.CallToolResult(content=[], structured_content={"data": BIG_TEXT})
    if name == "huge":
        return types.CallToolResult(content=[], structured_content={"data": "y" * OVER})
    return {"small": True}


TOOLS = [{"name": n, "description": n, "inputSchema": {"type": "object"}} for n in ("big", "huge", "small")]


class _Files(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        if self.path == "/big":
            body = BIG_BYTES
        elif self.path == "/huge-chunked":
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b"z" * (1 << 20)
            try:
                for _ in range(OVER // len(chunk) + 1):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the reader stopped at the cap, as it should
            return
        else:
            body = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(body)


@pytest.fixture(scope="module")
def files() -> Iterator[int]:
    with serve_in_thread(ThreadingHTTPServer(("127.0.0.1", 0), _Files)) as port:
        yield port


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def mcp() -> AsyncIterator[McpTestServer]:
    async with McpTestServer(TOOLS, handler, name="sizes") as srv:
        yield srv


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def old_mcp() -> AsyncIterator[McpTestServer]:
    async with McpTestServer(TOOLS, handler, name="old", legacy=True) as srv:
        yield srv


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def h(nats_url: str, redis_url: str) -> AsyncIterator[Harness]:
    harness = Harness(nats_url, redis_url)
    await harness.connect()
    await harness.dispatcher(max_output_bytes=CAP)
    try:
        yield harness
    finally:
        await harness.close()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def run(h: Harness, mcp: McpTestServer, old_mcp: McpTestServer) -> str:
    ts = await h.toolset(
        {
            "servers": [
                {"name": "sizes", "url": mcp.url, "tools": TOOLS},
                {"name": "old", "url": old_mcp.url, "tools": TOOLS},
            ],
            "http": {"allow": ["127.0.0.1"]},
        }
    )
    return await h.open_run(ts)


async def _read_ref(h: Harness, ref: dict[str, Any]) -> bytes:
    assert h.nc is not None
    store = await h.nc.jetstream().object_store(ref["bucket"])
    sink = io.BytesIO()  # nats-py's get() without a sink joins chunks quadratically (16 s for 50 MB)
    await store.get(ref["name"], writeinto=sink)
    data = sink.getvalue()
    assert len(data) == ref["size"] and hashlib.sha256(data).hexdigest() == ref["sha256"]
    return data


async def _completed_event(h: Harness, run_id: str, call_id: str) -> dict[str, Any]:
    assert h.nc is not None
    js = h.nc.jetstream()
    for _ in range(200):
        sub = await js.subscribe(
            h.subjects.call_events(run_id, call_id), stream=js_name(h.prefix, "EVENTS"), ordered_consumer=True
        )
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=1)
                except TimeoutError:
                    break
                event: dict[str, Any] = json.loads(msg.data)
                if event["type"] == "completed":
                    return event
        finally:
            await sub.unsubscribe()
        await asyncio.sleep(0.05)
    raise AssertionError("no completed event in the stream")


async def _agree(h: Harness, run_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """The reply, calls.get and the stream's completed event carry the same outcome; its ref."""
    got = await h.ok(h.subjects.calls_get, {"callId": data["callId"]})
    event = await _completed_event(h, run_id, data["callId"])
    assert got["outcome"] == data["outcome"] == event["outcome"]
    assert set(data["outcome"]) == {"status", "outputRef"}
    ref: dict[str, Any] = data["outcome"]["outputRef"]
    assert ref["bucket"] == js_name(h.prefix, "outputs") and ref["name"] == data["callId"]
    return ref


@pytest.mark.parametrize("server", ["sizes", "old"])
async def test_a_50_mb_mcp_output_is_read_back_by_reference_byte_for_byte(
    h: Harness, run: str, server: str, old_mcp: McpTestServer
) -> None:
    data = await h.invoke(run, f"{server}.big", {})
    ref = await _agree(h, run, data)
    assert orjson.loads(await _read_ref(h, ref)) == {"data": BIG_TEXT}
    if server == "old":
        assert old_mcp.initializations >= 1  # it went through a 2025-era session


async def test_a_50_mb_http_fetch_body_is_read_back_by_reference_byte_for_byte(
    h: Harness, run: str, files: int
) -> None:
    data = await h.invoke(run, "http.fetch", {"url": f"http://127.0.0.1:{files}/big"})
    ref = await _agree(h, run, data)
    output = orjson.loads(await _read_ref(h, ref))
    assert output["status"] == 200 and output["bodyEncoding"] == "base64"
    assert base64.b64decode(output["body"]) == BIG_BYTES


async def test_outputs_over_the_cap_end_output_too_large_without_retries(
    h: Harness, run: str, files: int
) -> None:
    for tool, inp in (
        ("sizes.huge", {}),
        ("old.huge", {}),
        ("http.fetch", {"url": f"http://127.0.0.1:{files}/huge-chunked"}),
    ):
        data = await h.invoke(run, tool, inp)
        assert data["outcome"]["status"] == "error", tool
        assert data["outcome"]["error"]["code"] == "outputTooLarge", data["outcome"]
        got = await h.ok(h.subjects.calls_get, {"callId": data["callId"]})
        assert got["attempts"] == 1 and got["outcome"] == data["outcome"]


async def test_a_small_output_stays_inline(h: Harness, run: str) -> None:
    data = await h.invoke(run, "sizes.small", {})
    assert data["outcome"] == {"status": "ok", "output": {"small": True}}


async def test_1000_calls_get_in_flight_all_answer(h: Harness, run: str) -> None:
    data = await h.invoke(run, "sizes.small", {})
    body = json.dumps({"callId": data["callId"]}).encode()
    assert h.nc is not None
    nc = h.nc
    replies = await asyncio.gather(
        *(nc.request(h.subjects.calls_get, body, timeout=60) for _ in range(1000)), return_exceptions=True
    )
    errors = [r for r in replies if isinstance(r, BaseException)]
    assert not errors, errors[:3]
    parsed = [json.loads(r.data) for r in replies if not isinstance(r, BaseException)]
    assert all(p["ok"] and p["data"]["state"] == "done" for p in parsed), [p for p in parsed if not p["ok"]][
        :3
    ]
