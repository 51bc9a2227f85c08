"""What one `http.fetch` may ask of the dispatcher, through a real dispatcher and a real HTTP
server on loopback: a request with too many headers, or too many header bytes, is `invalidInput`
at once with nothing sent (40,000 headers held the event loop 55 s in httpx's cookie handling); a
response listing more content codings than curl takes (5) is `upstreamError` at once (8,000
`gzip`s held it 16 s); a big compressed body decodes in turns with other calls. Meanwhile another
run's short call is answered within its own 5 s timeout (its time is printed, not asserted
tighter)."""

from __future__ import annotations

import asyncio
import gzip
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import pytest_asyncio

from tests.dispatcher.test_dispatcher_helpers import Harness
from tests.support.http_servers import serve_in_thread

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

STACKED = ", ".join(["gzip"] * 8000)
BOMB = gzip.compress(b"\0" * (16 << 20), 9)  # ~16 KiB that decodes to 16 MiB


class _Handler(BaseHTTPRequestHandler):
    hits: list[str] = []

    def log_message(self, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        self.hits.append(self.path)
        if self.path == "/stacked":
            self.send_response(200)
            self.send_header("Content-Encoding", STACKED)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/bomb":
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(BOMB)))
            self.end_headers()
            self.wfile.write(BOMB)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with serve_in_thread(ThreadingHTTPServer(("127.0.0.1", 0), _Handler)) as p:
        yield p


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def h(nats_url: str, redis_url: str) -> AsyncIterator[Harness]:
    harness = Harness(nats_url, redis_url)
    await harness.connect()
    await harness.dispatcher(max_output_bytes=64 << 20)
    try:
        yield harness
    finally:
        await harness.close()


async def _toolset(h: Harness) -> str:
    return await h.toolset({"http": {"allow": ["127.0.0.1"], "policy": {"timeout": "5s"}}})


async def _while_another_run_calls(
    h: Harness, port: int, tried: Awaitable[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any], float]:
    """(the tried call's reply, the other run's short call's reply, that call's seconds): the
    short call is sent just after the tried one."""
    other = await h.open_run(await _toolset(h))
    task = asyncio.ensure_future(tried)
    await asyncio.sleep(0.05)
    started = time.perf_counter()
    short = await h.invoke(other, "http.fetch", {"url": f"http://127.0.0.1:{port}/ok"})
    took = time.perf_counter() - started
    return await task, short, took


def _assert_on_time(short: dict[str, Any], took: float, what: str) -> None:
    print(f"\nanother run's short call while {what}: {took * 1000:.0f} ms")
    assert short["outcome"]["status"] == "ok", short
    assert short["outcome"]["output"]["body"] == "ok"
    assert took < 5.0  # its own timeout; it takes milliseconds when nothing holds the loop


async def test_too_many_headers_are_invalid_input_at_once_and_another_call_is_on_time(
    h: Harness, port: int
) -> None:
    run = await h.open_run(await _toolset(h))
    headers = {f"X-H{i:05d}": "v" for i in range(40_000)}
    before = len(_Handler.hits)
    bad, short, took = await _while_another_run_calls(
        h, port, h.invoke(run, "http.fetch", {"url": f"http://127.0.0.1:{port}/x", "headers": headers})
    )
    error = bad["outcome"]["error"]
    assert error["code"] == "invalidInput", error
    assert "at most 100" in error["message"] and "TOOLBUS_HTTP_MAX_HEADERS" in error["message"]
    assert _Handler.hits[before:] == ["/ok"]  # the tried call sent nothing
    _assert_on_time(short, took, "40,000 headers were refused")


async def test_too_many_header_bytes_are_invalid_input_and_nothing_is_sent(h: Harness, port: int) -> None:
    run = await h.open_run(await _toolset(h))
    headers = {f"X-Big-{i}": "v" * 2000 for i in range(40)}  # 40 headers, ~80 KB
    before = len(_Handler.hits)
    bad = await h.invoke(run, "http.fetch", {"url": f"http://127.0.0.1:{port}/x", "headers": headers})
    error = bad["outcome"]["error"]
    assert error["code"] == "invalidInput" and "TOOLBUS_HTTP_MAX_HEADER_BYTES" in error["message"], error
    assert len(_Handler.hits) == before
    got = await h.ok(h.subjects.calls_get, {"callId": bad["callId"]})
    assert got["attempts"] == 1


async def test_stacked_content_codings_are_an_upstream_error_and_another_call_is_on_time(
    h: Harness, port: int
) -> None:
    run = await h.open_run(await _toolset(h))
    bad, short, took = await _while_another_run_calls(
        h, port, h.invoke(run, "http.fetch", {"url": f"http://127.0.0.1:{port}/stacked"})
    )
    error = bad["outcome"]["error"]
    assert error["code"] == "upstreamError", error
    assert "8000 content codings" in error["message"] and "at most 5" in error["message"]
    _assert_on_time(short, took, "8,000 stacked codings were refused")


async def test_a_big_compressed_body_decodes_while_another_call_is_on_time(h: Harness, port: int) -> None:
    run = await h.open_run(await _toolset(h))
    big, short, took = await _while_another_run_calls(
        h, port, h.invoke(run, "http.fetch", {"url": f"http://127.0.0.1:{port}/bomb"})
    )
    assert big["outcome"]["status"] == "ok", big["outcome"].get("error")
    _assert_on_time(short, took, "a 16 MiB gzip body was decoded")
