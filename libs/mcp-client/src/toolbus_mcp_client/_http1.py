"""Keep-alive HTTP/1.1 POSTs to one MCP server for the fast path, on asyncio protocols parsed by
httptools: a call costs ~0.1 ms of client CPU here, where the httpx2 stack costs ~0.7.

It sends what the httpx2 path sends (the connection's headers, the request's MCP headers,
`Idempotency-Key`, the body) and reads the answer the way `_fast_call` does: a JSON body, or a
`text/event-stream` read until the response with our id. What it saw goes on the `Attempt`
(sent or not, status, network error) as `WatchingTransport` records it, and failures are the
`MCPError`s of the httpx2 path, so `_errors.classify` maps both paths alike.

It covers the common case only; the caller sends the rest through httpx2:
- `Http1Pool.for_url` gives None for a URL that is not plain http(s);
- a request whose header values are not plain ASCII text (or carry CR, LF or NUL) raises
  `Unsendable` before anything is written;
- an answer that redirects raises `Redirected` (httpx2 follows it within the origin, as the SDK).

An answer over `LARGE_BODY` bytes stops the socket being read (`pause_reading`) until the
attempt's `reserve` has returned.

A connection is reused only once its previous answer was read to the end, only while it has
been idle for less than `KEEPALIVE` seconds (uvicorn closes idle ones after 5), and only if
nothing (an EOF, stray bytes) is waiting on its socket. At most `MAX_CONNECTIONS` requests are
in flight per pool; more wait for a turn, as with httpx2's pool.
"""

from __future__ import annotations

import asyncio
import collections
import os
import re
import select
import socket
import ssl
import time
from collections.abc import Mapping
from typing import Any, Final

import httptools
import httpx2
from mcp.client.streamable_http import DEFAULT_MAX_SSE_EVENT_SIZE
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INTERNAL_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR
from toolbus_contracts.errors import OutputTooLarge

from toolbus_mcp_client._egress import EgressCheck, open_checked
from toolbus_mcp_client._fast_call import error_of, loads, outcome, too_large
from toolbus_mcp_client._transport import IDEMPOTENCY_HEADER, Attempt

KEEPALIVE: Final = 4.0
"""Seconds an idle connection is kept for reuse (below uvicorn's 5 s)."""
MAX_IDLE: Final = 20
MAX_CONNECTIONS: Final = 100
DRAIN: Final = 5.0
"""Seconds the rest of an answer may take after its result came (an SSE stream's end)."""

_OWN_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "accept-encoding"})
"""Headers the pool writes itself, or leaves out (it reads bodies as they come, uncompressed)."""
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # every control character but HTAB
_LINE_END = re.compile(rb"\r\n|\r|\n")


class Redirected(Exception):
    """The server answered 3xx: send the request through httpx2, which follows redirects."""


class Unsendable(Exception):
    """A header this pool does not write (not plain ASCII text): send the request through httpx2."""


_TOKENS: set[str] = set()
"""Header names already found to be tokens (a handful per process): checked once, not per call."""


def _field(name: str, value: str) -> str:
    """One header line; `Unsendable` for a name that is not a token or a value that is not plain
    ASCII text (CR, LF or another control character could end or split the request)."""
    if name not in _TOKENS:
        if not _TOKEN.fullmatch(name):
            raise Unsendable(name)
        if len(_TOKENS) < 1024:
            _TOKENS.add(name)
    # printable ASCII has no control character; only a value with one (HTAB is allowed) is searched
    if not value.isascii() or (not value.isprintable() and _CONTROL.search(value)):
        raise Unsendable(name)
    return f"{name}: {value}\r\n"


def _connect_reason(exc: BaseException) -> str:
    """Why connecting failed, without the address (the URL may carry a token)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS certificate verification failed: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS handshake failed: {exc.reason or type(exc).__name__}"
    if isinstance(exc, socket.gaierror):
        return exc.strerror or "the host name did not resolve"
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno)
    return "timed out" if isinstance(exc, TimeoutError) else type(exc).__name__


class _SseReader:
    """An incremental `text/event-stream` reader: bytes in, complete (event, data) pairs out. Bytes
    of an unfinished line are kept as the reads that brought them and joined once the line ends,
    so a long line (a large answer in one `data:` line) costs its length, not its length squared."""

    def __init__(self, max_event: int | None) -> None:
        self._parts: list[bytes] = []
        self._held = 0
        self._event = "message"
        self._data: list[str] = []
        self._size = 0
        self._max = max_event

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        events: list[tuple[str, str]] = []
        parts = self._parts
        if (parts and parts[-1].endswith(b"\r")) or b"\n" in chunk or b"\r" in chunk:
            buffer = b"".join(parts) + chunk if parts else chunk
            start = 0
            # what was held has no line end (a CR last at most): the search starts at its end
            for match in _LINE_END.finditer(buffer, max(0, self._held - 1)):
                if match.group() == b"\r" and match.end() == len(buffer):
                    break  # a CR last: the LF of a CRLF may come in the next chunk
                self._line(buffer[start : match.start()].decode("utf-8", errors="replace"), events)
                start = match.end()
            rest = buffer[start:]
            self._parts, self._held = ([rest] if rest else []), len(rest)
        else:
            parts.append(chunk)
            self._held += len(chunk)
        if self._max is not None and self._size + self._held > self._max:
            raise too_large(self._max)
        if self._max is None and self._size + self._held > DEFAULT_MAX_SSE_EVENT_SIZE:
            raise MCPError(CONNECTION_CLOSED, "SSE stream failed: an event is too large")
        return events

    def finish(self) -> list[tuple[str, str]]:
        """At the end of the stream: a CR held back ends its line after all."""
        events: list[tuple[str, str]] = []
        pending = b"".join(self._parts)
        if pending.endswith(b"\r"):
            self._line(pending[:-1].decode("utf-8", errors="replace"), events)
            self._parts, self._held = [], 0
        return events

    def _line(self, line: str, events: list[tuple[str, str]]) -> None:
        if not line:
            if self._data:
                events.append((self._event, "\n".join(self._data)))
            self._event, self._data, self._size = "message", [], 0
            return
        if line.startswith(":"):
            return
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "data":
            self._data.append(value)
            self._size += len(value)
        elif field == "event":
            self._event = value or "message"


class _Exchange:
    """One request's answer as it arrives: the status and headers, then the body; resolves
    `result` with the JSON-RPC result (or an `MCPError`) as soon as it is known."""

    def __init__(
        self,
        request_id: int,
        attempt: Attempt | None,
        max_body: int | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.request_id = request_id
        self.max_body = max_body
        self._received = 0
        self.attempt = attempt
        self.result: asyncio.Future[dict[str, Any]] = (loop or asyncio.get_running_loop()).create_future()
        self.headers: dict[str, str] = {}
        self.status = 0
        self.keep_alive = False
        self.complete = False
        self.returned = False  # the caller has its result; the rest of the answer is drained
        self._answered = False
        self._kind = ""
        self._buffer = bytearray()
        self._sse: _SseReader | None = None
        self.transport: asyncio.Transport | None = None
        """The connection's, set as the request is written: paused while a reservation waits."""
        self._reserving: asyncio.Future[None] | None = None
        self._reserved = False

    @property
    def answered(self) -> bool:
        """The caller's result is what the server answered (a result or a JSON-RPC error)."""
        return self._answered

    @property
    def until_close(self) -> bool:
        """The body has no length and is not chunked: it ends with the connection."""
        chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        return "content-length" not in self.headers and not chunked

    def header(self, name: str, value: str) -> None:
        old = self.headers.get(name)
        self.headers[name] = value if old is None else f"{old}, {value}"  # as httpx2 joins them

    def headers_done(self, status: int, keep_alive: bool) -> None:
        self.status, self.keep_alive = status, keep_alive
        redirect = 300 <= status < 400 and "location" in self.headers
        attempt = self.attempt
        if attempt is not None:
            attempt.sent = True
            if not redirect and (attempt.status is None or attempt.status < 400):
                attempt.status = status
                if status >= 400:
                    content_type = self.headers.get("content-type", "")
                    attempt.status_has_json = content_type.lower().startswith("application/json")
                    if status == 403:
                        attempt.read_challenge(self.headers.get("www-authenticate", ""))
        if redirect:
            self._settle(Redirected())
            return
        declared = self.headers.get("content-length", "")
        if self.max_body is not None and declared.isdigit() and int(declared) > self.max_body:
            self._settle(too_large(self.max_body))
            return
        content_type = self.headers.get("content-type", "").lower()
        if status == 202:
            self._settle(MCPError(INVALID_REQUEST, "server answered a request with 202 Accepted"))
        elif status >= 400:
            if content_type.startswith("application/json"):
                self._kind = "error-json"  # a JSON-RPC error may be in the body: read it
            else:
                self._settle(self._status_error())  # as httpx2: the body is not read
        elif content_type.startswith("application/json"):
            self._kind = "json"
        elif content_type.startswith("text/event-stream"):
            self._kind = "sse"
            self._sse = _SseReader(self.max_body)
        else:
            self._settle(MCPError(INVALID_REQUEST, f"Unexpected content type: {content_type}"))
            return
        if attempt is not None and attempt.reserve is not None:
            self._reserve(
                attempt.reservation(int(declared) if declared.isdigit() else None, 0, self.max_body)
            )

    def _reserve(self, size: int | None) -> None:
        """Stop reading until the attempt's `reserve(size)` has returned (None: not yet large)."""
        attempt = self.attempt
        if size is None or self._reserved or attempt is None or attempt.reserve is None:
            return
        self._reserved = True
        if self.transport is not None:
            self.transport.pause_reading()
        self._reserving = asyncio.ensure_future(attempt.reserve(size))
        self._reserving.add_done_callback(self._resume)

    def _resume(self, task: asyncio.Future[None]) -> None:
        self._reserving = None
        if not task.cancelled() and (error := task.exception()) is not None:
            self._settle(error)
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.resume_reading()

    def cancel_reservation(self) -> None:
        """The caller is done: a reservation still waiting is given up."""
        if self._reserving is not None:
            self._reserving.cancel()

    def body(self, chunk: bytes) -> None:
        if self.result.done():
            return  # settled already (the SSE answer came, or an error): the rest is drained
        self._received += len(chunk)
        if not self._reserved and self.attempt is not None and self.attempt.reserve is not None:
            self._reserve(self.attempt.reservation(None, self._received, self.max_body))
        if self._sse is None:
            if self.max_body is not None and self._received > self.max_body:
                self._buffer = bytearray()
                self._settle(too_large(self.max_body))  # the connection is closed, not read on
                return
            self._buffer += chunk
            return
        try:
            events = self._sse.feed(chunk)
        except (MCPError, OutputTooLarge) as exc:
            self._settle(exc)
            return
        self._take(events)

    def _take(self, events: list[tuple[str, str]]) -> None:
        """Settle with our answer if one of these SSE events is it."""
        for event, data in events:
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
            message = loads(self._buffer)  # orjson reads the bytearray itself: no copy
            self._buffer = bytearray()  # dropped as soon as it is parsed, not with the exchange
            if not isinstance(message, dict):
                self._settle(MCPError(PARSE_ERROR, "Failed to parse JSON response: not a JSON-RPC message"))
            elif message.get("id") is not None and str(message["id"]) != str(self.request_id):
                self.keep_alive = False  # out of step with the server: never reuse this connection
                self.broken("the server answered another request")
            else:
                self._settle_outcome(message)
        elif self._sse is not None:
            self._take(self._sse.finish())
            self._settle(MCPError(CONNECTION_CLOSED, "SSE stream ended without a response"))
        elif self._kind == "error-json":
            error = error_of(loads(self._buffer))
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


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection of a pool: one exchange at a time."""

    def __init__(self, pool: Http1Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.exchange: _Exchange | None = None
        self.closed = False
        self.idle_since = 0.0
        self.loop: asyncio.AbstractEventLoop | None = None
        """The connection's event loop, taken once it is made (each lookup is a `getpid`)."""
        self._interim = False
        self._drain: asyncio.TimerHandle | None = None

    def start(self, exchange: _Exchange, request: bytes) -> None:
        self.exchange = exchange
        self.parser = httptools.HttpResponseParser(self)
        assert self.transport is not None
        exchange.transport = self.transport
        self.transport.write(request)

    def reusable(self) -> bool:
        """Idle, open, and nothing (an EOF, stray bytes) waiting unread on the socket."""
        if self.closed or self.transport is None or self.transport.is_closing():
            return False
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return True
        try:
            readable, _, _ = select.select([sock.fileno()], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def settle(self) -> None:
        """The caller is done with the exchange: reuse the connection once its answer was read to
        the end; wait a little for the end of an answer still arriving; else close it."""
        exchange = self.exchange
        if exchange is not None:
            exchange.cancel_reservation()
        if exchange is None or self.closed:
            self.close()
        elif exchange.complete:
            self._finish()
        elif exchange.answered:
            exchange.returned = True
            self._drain = (self.loop or asyncio.get_running_loop()).call_later(DRAIN, self.close)
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
        self.pool.forget(self)

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        if self.exchange is None:
            self.close()  # bytes nobody asked for: the connection is out of step
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._broken("the server switched protocols")
        except httptools.HttpParserError as exc:
            self._broken(f"invalid HTTP answer ({type(exc).__name__})")

    def eof_received(self) -> bool | None:
        return None  # close our side too: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        exchange = self.exchange
        if exchange is not None and not exchange.complete:
            if exc is None and exchange.status and exchange.until_close:
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
        if self.exchange is not None and not self._interim:
            self.exchange.header(name.decode("latin-1").lower(), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (100 Continue, 103 Early Hints): the real one follows
            self._interim = True
            if self.exchange is not None:
                self.exchange.headers.clear()
            return
        if self.exchange is not None:
            self.exchange.headers_done(status, self.parser.should_keep_alive())

    def on_body(self, body: bytes) -> None:
        if self.exchange is not None and not self._interim:
            self.exchange.body(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        exchange = self.exchange
        if exchange is not None:
            exchange.done()
            if exchange.returned:
                self._finish()


class Http1Pool:
    """Keep-alive connections to one origin; concurrent POSTs each get a connection of their own."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        ssl_context: ssl.SSLContext | None,
        max_body: int | None = None,
        egress: EgressCheck | None = None,
    ) -> None:
        self._max_body = max_body
        self._egress = egress
        parsed = httpx2.URL(url)
        self._host = parsed.raw_host.decode("ascii")  # IDNA-encoded; an IPv6 address unbracketed
        default_port = 443 if parsed.scheme == "https" else 80
        self._port = parsed.port or default_port
        self._ssl = ssl_context if parsed.scheme == "https" else None
        host = self._host
        if ":" in host:
            host = f"[{host}]"
        authority = host if self._port == default_port else f"{host}:{self._port}"
        target = parsed.raw_path.decode("ascii") or "/"
        self._head = f"POST {target} HTTP/1.1\r\nHost: {authority}\r\n".encode("ascii")
        # the connection's own header lines, written (and refused, if they could never be) once
        self._defaults = {
            k.lower(): _field(k, v) for k, v in headers.items() if k.lower() not in _OWN_HEADERS
        }
        self._idle: collections.deque[_Connection] = collections.deque()
        self._live: set[_Connection] = set()
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        self._closed = False

    @classmethod
    def for_url(
        cls,
        url: str,
        headers: Mapping[str, str],
        ssl_context: ssl.SSLContext,
        max_body: int | None = None,
        egress: EgressCheck | None = None,
    ) -> Http1Pool | None:
        """A pool for `url`, or None where httpx2 must carry every request (not plain http(s),
        credentials in the URL, or a connection header that is not plain ASCII text)."""
        try:
            parsed = httpx2.URL(url)
            if parsed.scheme not in ("http", "https") or not parsed.host or parsed.userinfo:
                return None
            return cls(url, headers, ssl_context, max_body, egress)
        except (Unsendable, httpx2.InvalidURL, UnicodeError, ValueError):
            return None

    async def post(
        self,
        body: bytes,
        headers: Mapping[str, str],
        request_id: int,
        attempt: Attempt | None,
        connect_timeout: float = 30.0,
    ) -> dict[str, Any]:
        """POST `body` and return the JSON-RPC result; raise `MCPError`, or `Redirected` /
        `Unsendable` for requests httpx2 must carry."""
        lines = dict(self._defaults)  # the request's own headers win, as httpx2 merges them
        for name, value in headers.items():
            key = name.lower()
            if key not in _OWN_HEADERS:
                lines[key] = _field(name, value)
        if attempt is not None and attempt.idempotency_key is not None:
            lines["idempotency-key"] = _field(IDEMPOTENCY_HEADER, attempt.idempotency_key)
        head = "".join(lines.values()) + f"Content-Length: {len(body)}\r\n\r\n"
        request = self._head + head.encode("ascii") + body
        async with self._slots:
            conn = await self._connection(attempt, connect_timeout)
            exchange = _Exchange(request_id, attempt, self._max_body, conn.loop)
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

    def forget(self, conn: _Connection) -> None:
        self._live.discard(conn)

    async def _connection(self, attempt: Attempt | None, timeout: float) -> _Connection:  # noqa: ASYNC109
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.idle_since < KEEPALIVE and conn.reusable():
                return conn
            conn.close()
        try:
            async with asyncio.timeout(timeout):
                conn = await open_checked(
                    self._egress, lambda: _Connection(self), self._host, self._port, self._ssl
                )
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            if attempt is not None:
                attempt.network_error = f"connecting failed: {_connect_reason(exc)}"
            raise MCPError(CONNECTION_CLOSED, "could not connect") from None
        if self._closed:
            conn.close()
            raise MCPError(CONNECTION_CLOSED, "the connection is closed")
        self._live.add(conn)
        return conn

    def retire(self) -> None:
        """Take no new requests: close the idle connections, and the busy ones as they finish."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()

    def close(self) -> None:
        """Close every connection, idle or busy: requests in flight fail as the connection breaks."""
        self._closed = True
        self._idle.clear()
        for conn in list(self._live):
            conn.close()
