"""Keep-alive HTTP/1.1 POSTs to one MCP server for the fast path, on asyncio protocols parsed by
httptools: a call costs ~40 µs of client CPU here, where the httpx2 stack costs ~650.

It sends what the httpx2 path sends (the connection's credential headers, the request's MCP
headers, `Idempotency-Key`, the body) and reads the answer the same way `_fast_call` does: a JSON
body or a `text/event-stream` read until the response with our id. What it saw goes on the
`Attempt` (sent or not, status, network error) exactly as `WatchingTransport` records it, and
failures are the `MCPError`s of the httpx2 path, so `_errors.classify` maps both paths alike.

It covers the common case only. `Http1Pool.for_url` gives None (the caller keeps httpx2) where a
proxy applies or the URL is not plain http(s); an answer that redirects raises `Redirected`
before anything is consumed, and the caller sends that request through httpx2, which follows it
as the SDK would. Idle connections are dropped after `KEEPALIVE` seconds (servers close theirs:
uvicorn after 5 s) and whenever the server closed them, and a connection is reused only after
its previous answer was read to the end.
"""

from __future__ import annotations

import asyncio
import collections
import os
import ssl
import time
import urllib.request
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit

import httptools
from mcp.client.streamable_http import DEFAULT_MAX_SSE_EVENT_SIZE
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INTERNAL_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR

from toolbus_mcp_client._fast_call import error_of, loads, outcome
from toolbus_mcp_client._transport import IDEMPOTENCY_HEADER, Attempt

KEEPALIVE: Final = 4.0
"""Seconds an idle connection is kept for reuse (below uvicorn's 5 s, as httpx2's 5 s default)."""
MAX_IDLE: Final = 20
DRAIN: Final = 5.0
"""Seconds the rest of an answer may take after the result came (an SSE stream's end)."""


_OWN_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "accept-encoding"})
"""Headers the pool writes itself, or leaves out (it reads bodies as they come, uncompressed)."""


class Redirected(Exception):
    """The server answered 3xx: send the request through httpx2, which follows redirects."""


class _Broken(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _sse_events(buffer: bytearray) -> list[tuple[str, str]]:
    """Complete SSE events (event type, data) taken off the front of `buffer`."""
    events: list[tuple[str, str]] = []
    text_end = max(buffer.rfind(b"\n\n"), buffer.rfind(b"\r\n\r\n"), buffer.rfind(b"\r\r"))
    if text_end < 0:
        return events
    end = text_end + (4 if buffer[text_end : text_end + 4] == b"\r\n\r\n" else 2)
    block = bytes(buffer[:end]).decode("utf-8", errors="replace")
    del buffer[:end]
    kind, data = "message", list[str]()
    for line in block.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if not line:
            if data:
                events.append((kind, "\n".join(data)))
            kind, data = "message", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "data":
            data.append(value)
        elif field == "event":
            kind = value or "message"
    return events


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection of a pool: one exchange at a time."""

    def __init__(self, pool: Http1Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.exchange: _Exchange | None = None
        self.closed = False
        self.idle_since = 0.0
        self._drain: asyncio.TimerHandle | None = None

    def start(self, exchange: _Exchange, request: bytes) -> None:
        self.exchange = exchange
        self.parser = httptools.HttpResponseParser(self)
        assert self.transport is not None
        self.transport.write(request)

    def settle(self) -> None:
        """The caller is done with the exchange: reuse the connection once its answer was read to
        the end; wait a little for the end of an answer that is still arriving; else close it."""
        exchange = self.exchange
        if exchange is None or self.closed:
            self.close()
        elif exchange.complete:
            self._finish()
        elif exchange.answered:
            exchange.returned = True
            self._drain = asyncio.get_running_loop().call_later(DRAIN, self.close)
        else:
            self.close()

    def _finish(self) -> None:
        exchange, self.exchange = self.exchange, None
        if self._drain is not None:
            self._drain.cancel()
            self._drain = None
        if exchange is not None and exchange.keep_alive and not self.closed:
            self.pool.release(self)
        else:
            self.close()

    def close(self) -> None:
        self.closed = True
        self.exchange = None
        if self._drain is not None:
            self._drain.cancel()
            self._drain = None
        if self.transport is not None:
            self.transport.abort()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._broken("the server switched protocols")
        except httptools.HttpParserError as exc:
            self._broken(f"invalid HTTP answer ({exc})")

    def eof_received(self) -> bool | None:
        return None  # close our side too: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        exchange = self.exchange
        if exchange is not None and not exchange.complete:
            if exchange.status and exchange.until_close:
                exchange.keep_alive = False
                exchange.done()  # a body delimited by the end of the connection ends here
            else:
                exchange.broken(
                    "the server closed the connection before the whole answer"
                    + (f" ({type(exc).__name__})" if exc else "")
                )

    def _broken(self, reason: str) -> None:
        if self.exchange is not None:
            self.exchange.broken(reason)
        self.close()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if self.exchange is not None:
            self.exchange.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self.exchange is not None:
            self.exchange.headers_done(self.parser.get_status_code(), self.parser.should_keep_alive())

    def on_body(self, body: bytes) -> None:
        if self.exchange is not None:
            self.exchange.body(body)

    def on_message_complete(self) -> None:
        exchange = self.exchange
        if exchange is not None:
            exchange.done()
            if exchange.returned:
                self._finish()


class _Exchange:
    """One request's answer as it arrives: the status and headers, then the body; resolves
    `result` with the JSON-RPC result (or an `MCPError`) as soon as it is known."""

    def __init__(self, request_id: int, attempt: Attempt | None) -> None:
        self.request_id = request_id
        self.attempt = attempt
        self.result: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.headers: dict[str, str] = {}
        self.status = 0
        self.keep_alive = False
        self.complete = False
        self._answered = False
        self.returned = False  # the caller has its result; the rest of the answer is drained
        self._kind = ""
        self._buffer = bytearray()

    @property
    def answered(self) -> bool:
        """The caller's result is a JSON-RPC result or error the server sent (not a failure)."""
        return self.result.done() and not self.result.cancelled() and self._answered

    @property
    def until_close(self) -> bool:
        """The body has no length and is not chunked: it ends with the connection."""
        chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        return "content-length" not in self.headers and not chunked

    def headers_done(self, status: int, keep_alive: bool) -> None:
        self.status, self.keep_alive = status, keep_alive
        attempt = self.attempt
        if attempt is not None:
            attempt.sent = True
            if 300 <= status < 400 and "location" in self.headers:
                self._settle(Redirected())
                return
            if attempt.status is None or attempt.status < 400:
                attempt.status = status
                if status >= 400:
                    content_type = self.headers.get("content-type", "")
                    attempt.status_has_json = content_type.lower().startswith("application/json")
        elif 300 <= status < 400 and "location" in self.headers:
            self._settle(Redirected())
            return
        content_type = self.headers.get("content-type", "").lower()
        if status == 202:
            self._settle(MCPError(INVALID_REQUEST, "server answered a request with 202 Accepted"))
        elif status >= 400:
            self._kind = "error-json" if content_type.startswith("application/json") else "error"
        elif content_type.startswith("application/json"):
            self._kind = "json"
        elif content_type.startswith("text/event-stream"):
            self._kind = "sse"
        else:
            self._settle(MCPError(INVALID_REQUEST, f"Unexpected content type: {content_type}"))

    def body(self, chunk: bytes) -> None:
        if self.result.done():
            return  # settled already (the SSE answer came, or an error): drain the rest
        self._buffer += chunk
        if self._kind == "sse":
            if len(self._buffer) > DEFAULT_MAX_SSE_EVENT_SIZE:
                self._settle(MCPError(CONNECTION_CLOSED, "SSE stream failed: event too large"))
                return
            for event, data in _sse_events(self._buffer):
                if event != "message" or not data:
                    continue
                message = loads(data)
                if message is None:
                    self._settle(MCPError(PARSE_ERROR, "Failed to parse SSE message: invalid JSON"))
                    return
                if not isinstance(message, dict) or not ("result" in message or "error" in message):
                    continue  # a notification or a server request: not the answer
                answer_id = message.get("id")
                if answer_id is not None and str(answer_id) != str(self.request_id):
                    continue
                self._settle_outcome(message)
                return

    def done(self) -> None:
        self.complete = True
        if self.result.done():
            return
        if self._kind == "json":
            message = loads(bytes(self._buffer))
            if not isinstance(message, dict):
                self._settle(MCPError(PARSE_ERROR, "Failed to parse JSON response: not a JSON-RPC message"))
            else:
                self._settle_outcome(message)
        elif self._kind == "sse":
            self._settle(MCPError(CONNECTION_CLOSED, "SSE stream ended without a response"))
        elif self._kind == "error-json":
            error = error_of(loads(bytes(self._buffer)))
            self._settle(error if error is not None else self._status_error())
        else:
            self._settle(self._status_error())

    def _status_error(self) -> MCPError:
        if self.status == 404:
            return MCPError(METHOD_NOT_FOUND, "Not Found")
        return MCPError(INTERNAL_ERROR, "Server returned an error response")

    def broken(self, reason: str) -> None:
        """The connection failed after the request was written."""
        if self.result.done():
            return
        if self.attempt is not None:
            self.attempt.sent = True
            self.attempt.network_error = reason
        if self.status and self._kind in ("error", "error-json"):
            self._settle(self._status_error())  # as httpx2: the status stands, the body is lost
        else:
            self._settle(MCPError(CONNECTION_CLOSED, "the connection closed before the answer"))

    def _settle_outcome(self, message: dict[str, Any]) -> None:
        if self.result.done():
            return
        self._answered = True
        try:
            self.result.set_result(outcome(message))
        except MCPError as exc:
            self.result.set_exception(exc)

    def _settle(self, error: BaseException) -> None:
        if not self.result.done():
            self.result.set_exception(error)


class Http1Pool:
    """Keep-alive connections to one origin; any number of concurrent POSTs (one per connection)."""

    def __init__(self, url: str, headers: Mapping[str, str], ssl_context: ssl.SSLContext | None) -> None:
        parts = urlsplit(url)
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = ssl_context if parts.scheme == "https" else None
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        default_port = 443 if parts.scheme == "https" else 80
        authority = host if self._port == default_port else f"{host}:{self._port}"
        self._head = f"POST {target} HTTP/1.1\r\nHost: {authority}\r\n".encode("latin-1")
        self._defaults = {k.lower(): (k, v) for k, v in headers.items() if k.lower() not in _OWN_HEADERS}
        for name, value in self._defaults.values():
            f"{name}: {value}".encode("latin-1")  # refuse now what could not be written later
        self._idle: collections.deque[_Connection] = collections.deque()
        self._closed = False

    @classmethod
    def for_url(cls, url: str, headers: Mapping[str, str], ssl_context: ssl.SSLContext) -> Http1Pool | None:
        """A pool for `url`, or None where httpx2 must carry the requests (a proxy applies, the
        URL is not plain http(s), or a header cannot be written as HTTP/1.1 latin-1)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
            return None
        proxies = urllib.request.getproxies()
        if (proxies.get(parts.scheme) or proxies.get("all")) and not urllib.request.proxy_bypass(
            parts.hostname
        ):
            return None
        try:
            return cls(url, headers, ssl_context)
        except (UnicodeEncodeError, ValueError):
            return None

    async def post(
        self,
        body: bytes,
        headers: Mapping[str, str],
        request_id: int,
        attempt: Attempt | None,
        connect_timeout: float = 30.0,
    ) -> dict[str, Any]:
        """POST `body` and return the JSON-RPC result; raise `MCPError` (or `Redirected`)."""
        fields = dict(self._defaults)  # the request's own headers win, as httpx2 merges them
        for name, value in headers.items():
            key = name.lower()
            if key not in _OWN_HEADERS:
                fields[key] = (name, value)
        if attempt is not None and attempt.idempotency_key is not None:
            fields["idempotency-key"] = (IDEMPOTENCY_HEADER, attempt.idempotency_key)
        lines = [f"{name}: {value}\r\n" for name, value in fields.values()]
        lines.append(f"Content-Length: {len(body)}\r\n\r\n")
        request = self._head + "".join(lines).encode("latin-1") + body
        conn = await self._connection(attempt, connect_timeout)
        exchange = _Exchange(request_id, attempt)
        try:
            conn.start(exchange, request)
            return await exchange.result
        finally:
            conn.settle()

    def release(self, conn: _Connection) -> None:
        if self._closed or len(self._idle) >= MAX_IDLE:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    async def _connection(self, attempt: Attempt | None, timeout: float) -> _Connection:  # noqa: ASYNC109
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and now - conn.idle_since < KEEPALIVE:
                return conn
            conn.close()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self),
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                )
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            if attempt is not None:
                # the error's own text names the address: keep only what went wrong
                reason = (
                    os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else type(exc).__name__
                )
                attempt.network_error = f"connecting failed: {reason}"
            raise MCPError(CONNECTION_CLOSED, "could not connect") from None
        return conn

    def close(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()
