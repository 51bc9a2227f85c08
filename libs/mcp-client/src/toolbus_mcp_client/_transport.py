"""The httpx2 transport under every MCP connection: it watches each HTTP exchange for its caller.

The SDK's streamable HTTP transport runs each request's POST in a task of its own and turns
HTTP statuses into generic JSON-RPC errors; a network error raised there would tear the whole
connection down. So this transport never raises: it records what happened (sent or not, status,
network error) on the `Attempt` of the call that caused the request and hands the SDK a plain
error response instead. It also counts each answer's bytes against the `Attempt`'s `max_body`
and stops reading there (the SDK reads bodies whole and has no cap of its own); a compressed
answer is decoded here, within that cap (`decoding`), instead of whole by httpx2. The SDK copies the caller's `contextvars` into the POST task, so the
`Attempt` is found through a context variable with no lookup at all; the same path sets the
`Idempotency-Key` header of a tool call. An answer over `LARGE_BODY` bytes waits for the
attempt's `reserve` before it is read on (a bound on the memory of large answers in flight).
"""

from __future__ import annotations

import contextvars
import functools
import logging
import re
import ssl
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import httpcore2
import httpx2

from toolbus_mcp_client._egress import EgressCheck, guard_transport
from toolbus_mcp_client.decoding import BoundedDecoder, OverLimit

logger = logging.getLogger("toolbus_mcp_client")

IDEMPOTENCY_HEADER = "Idempotency-Key"

LARGE_BODY = 1 << 20
"""Bytes past which an answer is large: it is not read on until its caller's `reserve` returns."""

Reserve = Callable[[int], Awaitable[None]]
"""`await reserve(size)`: wait until an answer of `size` bytes may be held in memory."""

MAX_SCOPES = 32
"""Scopes kept from one `insufficient_scope` challenge (a server cannot make a call carry more)."""
_INSUFFICIENT_SCOPE = re.compile(r'\berror\s*=\s*"?insufficient_scope\b')
_SCOPE_PARAM = re.compile(r'\bscope\s*=\s*"([^"]{0,4096})"')
_SCOPE_TOKEN = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]{1,128}")
"""RFC 6749 section 3.3's scope-token, at most 128 characters."""

# A status no server sends: marks the stand-in response for a request that got no answer.
NO_ANSWER_STATUS = 599

# Network errors raised before a request's bytes could leave: connecting, DNS, a full pool.
_NOT_SENT = (
    httpx2.ConnectError,
    httpx2.ConnectTimeout,
    httpx2.PoolTimeout,
    httpx2.UnsupportedProtocol,
    httpx2.LocalProtocolError,  # the request could not be written (e.g. an illegal header value)
)


@dataclass(slots=True)
class Attempt:
    """What one logical operation (a call, a listing, an open) saw on the wire."""

    idempotency_key: str | None = None
    sent: bool = False
    status: int | None = None
    network_error: str | None = None
    # The error status came with a JSON body: a JSON-RPC error the SDK passes on as it is.
    status_has_json: bool = False
    # A 403 whose WWW-Authenticate says `error="insufficient_scope"` (RFC 6750): a token with a
    # larger scope would do (step-up), unlike any other 403; `required_scopes` are the scopes its
    # `scope` parameter asks for (empty when it names none).
    insufficient_scope: bool = False
    required_scopes: tuple[str, ...] = ()
    # The longest answer read, in bytes over all of the operation's exchanges (None: no cap);
    # past it the body is not read on and `too_large` is set (see `BodyOverCap`).
    max_body: int | None = None
    received: int = 0
    too_large: bool = False
    reserve: Reserve | None = None
    """Called once an answer is known to be large (see `LARGE_BODY`), before it is read on."""

    def read_challenge(self, challenge: str) -> None:
        """Note a 403's `WWW-Authenticate`: step-up when it says `insufficient_scope`, and the
        scopes it asks for (RFC 6750 section 3; at most `MAX_SCOPES` well-formed scope tokens)."""
        self.insufficient_scope = _INSUFFICIENT_SCOPE.search(challenge) is not None
        found = _SCOPE_PARAM.search(challenge) if self.insufficient_scope else None
        words = found.group(1).split() if found else []
        self.required_scopes = tuple(dict.fromkeys(w for w in words if _SCOPE_TOKEN.fullmatch(w)))[
            :MAX_SCOPES
        ]

    def reservation(self, declared: int | None, seen: int, cap: int | None = None) -> int | None:
        """The size to reserve for an answer `declared` long (None: unknown) of which `seen`
        bytes were read, or None when nothing is to be reserved (yet). An answer of unknown
        length reserves the output cap (`cap`, else `max_body`)."""
        if self.reserve is None:
            return None
        if declared is not None:
            return declared if declared > LARGE_BODY else None
        if seen > LARGE_BODY:
            cap = cap if cap is not None else self.max_body
            return cap if cap is not None else 2 * seen
        return None

    @property
    def failed_before_sending(self) -> bool:
        return self.network_error is not None and not self.sent


current_attempt: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar(
    "toolbus_mcp_attempt", default=None
)


def _describe(exc: Exception) -> str:
    """A short reason for a network error, free of URLs and headers."""
    if isinstance(exc, httpx2.LocalProtocolError):
        return "the request could not be written (an illegal header name or value)"  # h11 quotes it
    text = str(exc).strip()
    if not text or len(text) > 120:
        return type(exc).__name__
    return text


class BodyOverCap(httpx2.SSEError, httpx2.StreamError):
    """The answer passed its operation's `max_body`: reading stopped there (the connection is
    closed with the rest unread). Both bases on purpose: the SDK's JSON reader turns a
    `StreamError` into a parse error and its SSE reader an `SSEError` into "stream failed", each
    at once (any other error would make an SSE reader with an event id reconnect and read on);
    the caller sees `Attempt.too_large` and raises `OutputTooLarge`."""


class _WatchedStream(httpx2.AsyncByteStream):
    """A response body that ends (instead of raising) when the connection breaks mid-body, and
    stops at the attempt's `max_body` (raising `BodyOverCap`)."""

    __slots__ = ("_attempt", "_declared", "_decoder", "_inner", "_over")

    def __init__(
        self,
        inner: httpx2.AsyncByteStream,
        attempt: Attempt | None,
        *,
        over: bool = False,
        decoder: BoundedDecoder | None = None,
        declared: int | None = None,
    ) -> None:
        self._inner = inner
        self._attempt = attempt
        self._declared = declared  # the body's declared length (None: unknown, or encoded)
        self._over = over  # the declared length is over the cap already: read nothing
        self._decoder = decoder  # the body's Content-Encoding, undone here within the cap

    async def __aiter__(self) -> AsyncIterator[bytes]:
        attempt = self._attempt
        limit = attempt.max_body if attempt is not None else None
        if not self._over:
            try:
                reserve = attempt.reserve if attempt is not None else None
                seen = 0
                if reserve is not None:
                    assert attempt is not None
                    size = attempt.reservation(self._declared, 0)
                    if size is not None:
                        await reserve(size)
                        reserve = None
                async for raw in self._inner:
                    chunk = self._decoded(raw)
                    if reserve is not None:
                        assert attempt is not None
                        seen += len(chunk)
                        size = attempt.reservation(None, seen)
                        if size is not None:
                            await reserve(size)
                            reserve = None
                    if limit is not None:
                        assert attempt is not None
                        attempt.received += len(chunk)
                        if attempt.received > limit:
                            self._over = True
                            break
                    yield chunk
                if self._decoder is not None and not self._over:
                    tail = self._decoded(b"", end=True)
                    if tail:
                        assert attempt is not None
                        attempt.received += len(tail)
                        yield tail
            except OverLimit:
                self._over = True
            except httpx2.TransportError as exc:
                if attempt is not None:
                    attempt.network_error = _describe(exc)
                logger.debug("MCP response body broke off: %s", type(exc).__name__)
        if self._over:
            assert attempt is not None
            attempt.too_large = True
            raise BodyOverCap(f"the answer is longer than {limit} bytes (the output cap)")

    def _decoded(self, raw: bytes, *, end: bool = False) -> bytes:
        decoder = self._decoder
        if decoder is None:
            return raw
        try:
            return decoder.flush() if end else decoder.feed(raw)
        except zlib.error:
            raise httpx2.DecodingError("the body does not decode as its Content-Encoding says") from None

    async def aclose(self) -> None:
        await self._inner.aclose()


class WatchingTransport(httpx2.AsyncBaseTransport):
    """Wraps a real transport: stamps the idempotency key, records outcomes, never raises."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        attempt = current_attempt.get()
        if attempt is not None and attempt.idempotency_key is not None and request.method == "POST":
            request.headers[IDEMPOTENCY_HEADER] = attempt.idempotency_key
        try:
            response = await self._inner.handle_async_request(request)
        except httpx2.TransportError as exc:
            if attempt is not None:
                attempt.network_error = _describe(exc)
                attempt.sent = attempt.sent or not isinstance(exc, _NOT_SENT)
            logger.debug("MCP request got no answer: %s", type(exc).__name__)
            return httpx2.Response(
                NO_ANSWER_STATUS, headers={"content-type": "text/plain"}, content=b"", request=request
            )
        if attempt is not None:
            attempt.sent = True
            # An error status sticks: a later exchange of the same operation must not hide it.
            if attempt.status is None or attempt.status < 400:
                attempt.status = response.status_code
                if response.status_code >= 400:
                    content_type = response.headers.get("content-type", "")
                    attempt.status_has_json = content_type.lower().startswith("application/json")
                    if response.status_code == 403:
                        attempt.read_challenge(response.headers.get("www-authenticate", ""))
        stream = response.stream
        assert isinstance(stream, httpx2.AsyncByteStream)
        over = False
        if attempt is not None and attempt.max_body is not None:
            declared = response.headers.get("content-length", "")
            over = declared.isdigit() and attempt.received + int(declared) > attempt.max_body
            decoder = BoundedDecoder(
                response.headers.get("content-encoding", ""), attempt.max_body - attempt.received
            )
            if decoder.decodes:  # decoded here within the cap, so httpx2 must not decode it again
                del response.headers["content-encoding"]
                response.headers.pop("content-length", None)
                response.stream = _WatchedStream(stream, attempt, over=over, decoder=decoder)
                return response
        declared = response.headers.get("content-length", "")
        response.stream = _WatchedStream(
            stream, attempt, over=over, declared=int(declared) if declared.isdigit() else None
        )
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The default TLS context, built once: loading the CA bundle costs ~19 ms of CPU, which a
    fresh context per client would pay again for every server and credential set."""
    return httpcore2.default_ssl_context()


def build_http_client(headers: dict[str, str], egress: EgressCheck | None = None) -> httpx2.AsyncClient:
    """One pooled httpx2 client with the server's credential headers and the SDK's timeouts,
    connecting only where `egress` allows (see `_egress`). A value beyond ASCII goes as its
    Latin-1 bytes (RFC 9110's obs-text, what the credential rules take): given as text, httpx2
    would encode it as ASCII and raise on every request."""
    inner = httpx2.AsyncHTTPTransport(verify=tls_context())
    guard_transport(inner, egress)
    return httpx2.AsyncClient(
        headers={k.encode("ascii"): v.encode("latin-1") for k, v in headers.items()},
        timeout=httpx2.Timeout(30.0, read=300.0),
        transport=WatchingTransport(inner),
    )
