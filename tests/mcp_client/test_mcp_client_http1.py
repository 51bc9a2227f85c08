"""The lean HTTP/1.1 pool of the MCP fast path against a raw socket server that answers what a
real server rarely gives on demand: each answer raises what the httpx2 path raises for it (the
same table as test_mcp_client_fast_call), framing (length, chunked, until close), keep-alive
reuse, and what it records on the `Attempt`."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INTERNAL_ERROR
from toolbus_mcp_client._http1 import Http1Pool, Redirected, Unsendable
from toolbus_mcp_client._transport import Attempt

from tests.support.infra import free_port, until
from tests.support.mcp_answers import NOT_A_RESULT, NOT_A_RESULT_FIELDS, NOT_A_RESULT_IDS, RESULT, sse

Reply = bytes | Callable[[asyncio.StreamWriter], Awaitable[None]]


def http(status: int, body: bytes, content_type: str, *, close: bool = False, chunked: bool = False) -> bytes:
    head = [f"HTTP/1.1 {status} X", f"content-type: {content_type}"]
    if close:
        head.append("connection: close")
    if chunked:
        head.append("transfer-encoding: chunked")
        framed = b"".join(
            b"%x\r\n%s\r\n" % (len(body[i : i + 7]), body[i : i + 7]) for i in range(0, len(body), 7)
        )
        return ("\r\n".join(head) + "\r\n\r\n").encode() + framed + b"0\r\n\r\n"
    head.append(f"content-length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Scripted:
    """A raw HTTP/1.1 server on a port the OS picks as it binds (known once started) that answers
    each request with the next reply."""

    def __init__(self, *replies: Reply, path: str = "/mcp") -> None:
        self.replies = list(replies)
        self.connections = 0
        self.requests: list[tuple[str, bytes]] = []
        self.port = 0
        self.path = path
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while self.replies:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                length = next(
                    int(line.split(":", 1)[1])
                    for line in head.split("\r\n")
                    if line.lower().startswith("content-length:")
                )
                self.requests.append((head, await reader.readexactly(length)))
                reply = self.replies.pop(0)
                if isinstance(reply, bytes):
                    writer.write(reply)
                    await writer.drain()
                    if b"connection: close" in reply.split(b"\r\n\r\n")[0]:
                        break
                else:
                    await reply(writer)
                    if writer.is_closing():
                        return
        writer.close()

    @property
    def url(self) -> str:
        assert self.port, "the server is not started"
        return f"http://127.0.0.1:{self.port}{self.path}"

    async def __aenter__(self) -> Scripted:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def pool_for(server: Scripted) -> AsyncIterator[Http1Pool]:
    pool = Http1Pool.for_url(
        server.url, {"Authorization": "Bearer t", "accept": "*/*"}, ssl.create_default_context()
    )
    assert pool is not None
    try:
        yield pool
    finally:
        pool.close()


async def post(pool: Http1Pool, attempt: Attempt | None = None, request_id: int = 7) -> dict[str, Any]:
    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    return await pool.post(b"{}", headers, request_id, attempt or Attempt())


def ok_json(request_id: int = 7, **framing: bool) -> bytes:
    return http(
        200,
        orjson.dumps({"jsonrpc": "2.0", "id": request_id, "result": RESULT}),
        "application/json",
        **framing,
    )


@pytest.mark.parametrize(NOT_A_RESULT_FIELDS, NOT_A_RESULT, ids=NOT_A_RESULT_IDS)
@pytest.mark.parametrize("chunked", [False, True], ids=["length", "chunked"])
async def test_answers_that_are_not_a_result_raise_what_the_httpx_path_raises(
    status: int, body: bytes, content_type: str, code: int, message: str | None, chunked: bool
) -> None:
    async with (
        Scripted(http(status, body, content_type, chunked=chunked)) as server,
        pool_for(server) as pool,
    ):
        with pytest.raises(MCPError) as info:
            await post(pool)
    assert info.value.code == code
    if message is not None:
        assert info.value.message == message


async def test_sse_in_pieces_skips_notifications_and_the_connection_is_reused() -> None:
    body = b": keep-alive\n\nevent: message\ndata:\nid: prime\n\n" + sse(
        {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 7, "progress": 1}},
        {"jsonrpc": "2.0", "id": 99, "result": {"content": []}},
        {"jsonrpc": "2.0", "id": 7, "result": RESULT},
    )
    answer = http(200, body.replace(b"\n", b"\r\n"), "text/event-stream", chunked=True)
    async with Scripted(answer, ok_json(8)) as server, pool_for(server) as pool:
        assert await post(pool) == RESULT
        await asyncio.sleep(0.01)  # the stream's last chunk may come after the answer
        assert await post(pool, request_id=8) == RESULT
    assert server.connections == 1


async def test_request_carries_merged_headers_the_key_and_no_accept_encoding() -> None:
    async with Scripted(ok_json()) as server, pool_for(server) as pool:
        await post(pool, Attempt(idempotency_key="key-1"))
    head, body = server.requests[0]
    lines = head.lower().split("\r\n")
    assert lines[0] == "post /mcp http/1.1" and f"host: 127.0.0.1:{server.port}" in lines
    assert "accept: application/json, text/event-stream" in lines and "accept: */*" not in lines
    assert "authorization: bearer t" in lines and "idempotency-key: key-1" in lines
    assert not any(line.startswith("accept-encoding") for line in lines) and body == b"{}"


async def test_connection_close_and_body_until_close_are_not_reused() -> None:
    until_close = b"HTTP/1.1 200 X\r\ncontent-type: application/json\r\n\r\n" + orjson.dumps(
        {"jsonrpc": "2.0", "id": 7, "result": RESULT}
    )

    async def then_close(writer: asyncio.StreamWriter) -> None:
        writer.write(until_close)
        await writer.drain()
        writer.close()

    async with Scripted(ok_json(close=True), then_close, ok_json()) as server, pool_for(server) as pool:
        for _ in range(3):
            assert await post(pool) == RESULT
    assert server.connections == 3


async def test_a_connection_broken_mid_answer_is_a_network_error_after_sending() -> None:
    async def half(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 X\r\ncontent-type: application/json\r\ncontent-length: 4096\r\n\r\n{")
        await writer.drain()
        writer.close()

    async with Scripted(half) as server, pool_for(server) as pool:
        attempt = Attempt()
        with pytest.raises(MCPError) as info:
            await post(pool, attempt)
    assert info.value.code == CONNECTION_CLOSED
    assert attempt.sent and attempt.network_error is not None and attempt.status == 200


async def test_connection_refused_is_a_network_error_before_sending() -> None:
    pool = Http1Pool.for_url(f"http://127.0.0.1:{free_port()}/mcp", {}, ssl.create_default_context())
    assert pool is not None
    attempt = Attempt()
    with pytest.raises(MCPError):
        await post(pool, attempt)
    assert attempt.failed_before_sending and "refused" in (attempt.network_error or "").lower()


async def test_error_statuses_are_recorded_and_redirects_handed_back() -> None:
    denied = http(
        401,
        orjson.dumps({"jsonrpc": "2.0", "id": 7, "error": {"code": -32001, "message": "no"}}),
        "application/json",
    )
    moved = b"HTTP/1.1 307 X\r\nlocation: /mcp/\r\ncontent-length: 0\r\n\r\n"
    async with Scripted(denied, moved) as server, pool_for(server) as pool:
        attempt = Attempt()
        with pytest.raises(MCPError) as info:
            await post(pool, attempt)
        assert (info.value.code, attempt.status, attempt.status_has_json) == (-32001, 401, True)
        with pytest.raises(Redirected):
            await post(pool)


async def test_an_answer_whose_stream_stays_open_returns_at_once_and_its_connection_is_not_reused() -> None:
    async def answer_then_hang(writer: asyncio.StreamWriter) -> None:
        head = b"HTTP/1.1 200 X\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        event = sse({"jsonrpc": "2.0", "id": 7, "result": RESULT})
        writer.write(head + b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        await asyncio.sleep(30)

    async with Scripted(answer_then_hang, ok_json()) as server, pool_for(server) as pool:
        assert await asyncio.wait_for(post(pool), 5) == RESULT
        assert await asyncio.wait_for(post(pool), 5) == RESULT
    assert server.connections == 2


def test_no_pool_for_a_url_or_header_it_does_not_carry() -> None:
    context = ssl.create_default_context()
    assert Http1Pool.for_url("https://user:pw@example.com/mcp", {}, context) is None
    assert Http1Pool.for_url("ftp://example.com/mcp", {}, context) is None
    assert Http1Pool.for_url("http://example.com/mcp", {"X": "é✓"}, context) is None
    assert Http1Pool.for_url("https://example.com/mcp", {"Authorization": "Bearer t"}, context) is not None


async def test_an_interim_answer_is_skipped_and_each_call_gets_its_own_answer() -> None:
    async def hints_then_ok(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </x>; rel=preload\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(ok_json(7))

    async with Scripted(hints_then_ok, ok_json(8)) as server, pool_for(server) as pool:
        assert await post(pool, request_id=7) == RESULT
        assert await post(pool, request_id=8) == RESULT
    assert server.connections == 1


@pytest.mark.parametrize(
    "key", ["k\r\nX-Injected: yes\r\nContent-Length: 0\r\n\r\nGET /admin HTTP/1.1", "ключ", "a\x00b"]
)
async def test_a_header_it_cannot_write_safely_is_handed_back_unsent(key: str) -> None:
    async with Scripted(ok_json()) as server, pool_for(server) as pool:
        attempt = Attempt(idempotency_key=key)
        with pytest.raises(Unsendable):
            await post(pool, attempt)
    assert server.requests == [] and not attempt.sent
    assert (
        Http1Pool.for_url(server.url, {"Authorization": "Bearer abc\n"}, ssl.create_default_context()) is None
    )


async def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    async def answer_then_close(writer: asyncio.StreamWriter) -> None:
        writer.write(ok_json())  # keep-alive as far as the headers say, then closed anyway
        await writer.drain()
        writer.close()

    async with Scripted(answer_then_close, ok_json()) as server, pool_for(server) as pool:
        assert await post(pool) == RESULT
        await asyncio.sleep(0.05)
        attempt = Attempt()
        assert await post(pool, attempt) == RESULT
    assert server.connections == 2 and attempt.network_error is None


async def test_an_error_status_without_json_is_known_at_its_headers() -> None:
    async def unavailable_forever(writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 503 X\r\ncontent-type: text/html\r\ntransfer-encoding: chunked\r\n\r\n5\r\n<html\r\n"
        )
        await writer.drain()
        await asyncio.sleep(30)

    async with Scripted(unavailable_forever) as server, pool_for(server) as pool:
        attempt = Attempt()
        with pytest.raises(MCPError) as info:
            await asyncio.wait_for(post(pool, attempt), 5)
    assert (info.value.code, attempt.status, attempt.network_error) == (INTERNAL_ERROR, 503, None)


async def test_sse_line_endings_of_every_kind_and_split_anywhere() -> None:
    event = orjson.dumps({"jsonrpc": "2.0", "id": 7, "result": RESULT})
    body = b"event: message\n\r\n" + b"data: " + event + b"\r\r"  # LF then CRLF; CR CR
    chunks = [body[:5], body[5:17], body[17:18], body[18:-1], body[-1:]]

    async def pieces(writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 X\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        for chunk in chunks:
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
            await asyncio.sleep(0.005)
        writer.write(b"0\r\n\r\n")

    async with Scripted(pieces) as server, pool_for(server) as pool:
        assert await asyncio.wait_for(post(pool), 5) == RESULT


async def test_the_request_target_is_percent_encoded_and_dns_failures_name_no_host() -> None:
    async with Scripted(ok_json(), path="/my mcp/é?x=1") as server, pool_for(server) as pool:
        await post(pool)
    assert server.requests[0][0].startswith("POST /my%20mcp/%C3%A9?x=1 HTTP/1.1\r\n")
    pool2 = Http1Pool.for_url("http://no-such-host.invalid/mcp", {}, ssl.create_default_context())
    assert pool2 is not None
    attempt = Attempt()
    with pytest.raises(MCPError):
        await post(pool2, attempt)
    assert attempt.failed_before_sending and "invalid" not in (attempt.network_error or "")


async def test_a_retired_pool_lets_calls_in_flight_finish_then_closes_their_connections() -> None:
    # The server holds its answer until the pool is retired, so the call is in flight (its
    # request received) when `retire()` runs: a fixed sleep before it let a loaded machine
    # retire the pool before the call had its connection, which then failed "closed".
    answer = asyncio.Event()

    async def held(writer: asyncio.StreamWriter) -> None:
        await answer.wait()
        writer.write(ok_json())

    async with Scripted(held) as server, pool_for(server) as pool:
        call = asyncio.create_task(post(pool))
        await until(lambda: len(server.requests) == 1, "the call's request reached the server")
        pool.retire()
        assert not call.done() and len(pool._live) == 1
        answer.set()
        assert await call == RESULT
        assert not pool._live and not pool._idle


@pytest.mark.parametrize("sep", [b"\r\n", b"\r", b"\n"])
@pytest.mark.parametrize("step", [1, 2, 3, 7, 4096])
def test_sse_lines_held_over_many_reads_frame_as_in_one(sep: bytes, step: int) -> None:
    """Bytes of an unfinished line are held as their reads (joined once the line ends): the events
    are the same whichever way the stream is cut, a long `data:` line included."""
    from toolbus_mcp_client._http1 import _SseReader

    long = b"x" * 10_000
    stream = (
        b"event: message" + sep + b"data: hello" + sep + b"data: " + long + sep + sep
        + b": a comment" + sep + b"data: 2" + sep + sep
    )  # fmt: skip
    reader = _SseReader(None)
    events = []
    for at in range(0, len(stream), step):
        events += reader.feed(stream[at : at + step])
    events += reader.finish()
    assert events == [("message", "hello\n" + long.decode()), ("message", "2")]
