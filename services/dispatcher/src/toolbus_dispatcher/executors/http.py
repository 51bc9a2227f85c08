"""The built-in `http.fetch` tool: one pooled httpx client, redirects followed here so that every
hop is checked against the toolset's allow-list (and never from https down to http), every
connection made to an address the deployment's egress policy allows (`guard`), headers checked
and bounded (count and bytes) before anything is sent, bodies read up to the output cap
(`outputTooLarge`). A redirect to another origin carries only the caller's headers that hold no
credential (`CROSS_ORIGIN_HEADERS`).

The cap counts decoded bytes, and decoding is bounded too: the raw body is read as it comes and
inflated by `toolbus_mcp_client.decoding` in pieces of at most 256 KiB, counted as they come and
with the event loop given a turn between them, so a compressed body over the cap (a "gzip bomb")
costs the cap, not its decoded size, and no other call waits on it; a response listing more than
5 content codings is `upstreamError` before anything is decoded. `Accept-Encoding` is
`gzip, deflate` (the codings decoded so) unless the input sets it."""

from __future__ import annotations

import asyncio
import base64
import codecs
import re
import ssl
import zlib
from typing import Any
from urllib.parse import urljoin, urlunsplit

import httpx
from toolbus_common.egress import EgressPolicy
from toolbus_common.lru import Lru
from toolbus_common.private.httpcore_guard import GuardedBackend, Resolver, guard_transport
from toolbus_contracts.errors import (
    HostNotAllowed,
    InvalidInput,
    OutputTooLarge,
    UpstreamError,
    UpstreamUnreachable,
)
from toolbus_mcp_client import LARGE_BODY, Reserve
from toolbus_mcp_client.decoding import MAX_CODINGS, BoundedDecoder, OverLimit, TooManyCodings, codings

from toolbus_dispatcher.allowlist import AllowList
from toolbus_dispatcher.executors.base import Attempt, Interrupted

REDIRECTS = frozenset({301, 302, 303, 307, 308})
INTERRUPTING = frozenset({502, 503, 504})
_TEXT_TYPES = (
    "application/json",
    "application/xml",
    "application/javascript",
    "application/x-www-form-urlencoded",
)
_DROP_HEADERS = frozenset({"host", "idempotency-key", "content-length", "transfer-encoding", "connection"})
CROSS_ORIGIN_HEADERS = frozenset(
    {
        "accept",
        "accept-encoding",
        "accept-language",
        "cache-control",
        "content-language",
        "content-type",
        "idempotency-key",
        "pragma",
        "user-agent",
    }
)
"""The caller's headers a redirect to another origin (scheme, host or port) carries: content
negotiation and the call's idempotency key. Any other (`Authorization`, `Cookie`, `X-Api-Key`, a
vendor's token header) was meant for the first origin only and is dropped."""
ALLOW_LISTS = 256
"""Toolsets whose parsed HTTP allow-lists are kept (least recently used dropped first)."""
MAX_HEADERS = 100
"""Default of `TOOLBUS_HTTP_MAX_HEADERS`: the most request headers one `http.fetch` may give."""
MAX_HEADER_BYTES = 64 * 1024
"""Default of `TOOLBUS_HTTP_MAX_HEADER_BYTES`: the most bytes its headers may hold in all
(`name: value` lines)."""
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")  # C0 but HTAB, DEL, C1


def checked_headers(
    given: Any, max_count: int = MAX_HEADERS, max_bytes: int = MAX_HEADER_BYTES
) -> dict[str, bytes]:
    """The request headers of an `http.fetch` input as the bytes to send, or `InvalidInput`
    naming the bad one. At most `max_count` headers of at most `max_bytes` in all (`name: value`
    lines, CRLF included), refused before any is looked at otherwise. Names must be HTTP tokens; values are RFC 9110 field values written as
    text: visible ASCII, spaces and tabs inside, and Latin-1 letters (obs-text, sent as their
    Latin-1 bytes); no control character (no CR/LF injection, no C1 controls), no leading or
    trailing space or tab, nothing outside Latin-1 (a caller encodes such text itself, e.g. RFC
    8187 or percent-encoding). Checked before anything is sent: httpx would raise on the first
    non-ASCII value (it encodes `str` values as ASCII) and h11 on a padded one."""
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise InvalidInput("Input 'headers' must be an object of strings.", details={"path": "$.headers"})
    if len(given) > max_count:
        raise InvalidInput(
            f"Input 'headers' has {len(given)} headers; at most {max_count} are sent (TOOLBUS_HTTP_MAX_HEADERS).",
            details={"path": "$.headers", "limit": max_count},
        )
    size = sum(len(str(k)) + len(v) + 4 if isinstance(v, str) else 0 for k, v in given.items())
    if size > max_bytes:
        raise InvalidInput(
            f"Input 'headers' holds {size} bytes; at most {max_bytes} are sent (TOOLBUS_HTTP_MAX_HEADER_BYTES).",
            details={"path": "$.headers", "limit": max_bytes},
        )
    out: dict[str, bytes] = {}
    for name, value in given.items():
        path = f"$.headers.{str(name)[:64]}"
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise InvalidInput(
                "A header name must be an HTTP token (letters, digits, !#$%&'*+-.^_`|~).",
                details={"path": path},
            )
        if not isinstance(value, str) or _CONTROL.search(value):
            raise InvalidInput(
                f"Header '{name[:64]}' has a control character (CR, LF, NUL...) or is not a string.",
                details={"path": path},
            )
        if value != value.strip(" \t"):
            raise InvalidInput(
                f"Header '{name[:64]}' starts or ends with a space or tab: an HTTP field value cannot.",
                details={"path": path},
            )
        try:
            raw = value.encode("latin-1")
        except UnicodeEncodeError:
            raise InvalidInput(
                f"Header '{name[:64]}' has characters outside Latin-1; encode them first.",
                details={"path": path},
            ) from None
        if name.lower() not in _DROP_HEADERS:
            out[name] = raw
    return out


def _charset(content_type: str) -> str | None:
    """The charset that makes this body text, or None for binary content."""
    main, _, params = content_type.partition(";")
    main = main.strip().lower()
    charset = None
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip():
            charset = value.strip().strip('"').lower()
    if charset:
        try:
            codecs.lookup(charset)
        except LookupError:
            return None
        return charset
    if main.startswith("text/") or main in _TEXT_TYPES or main.endswith(("+json", "+xml")):
        return "utf-8"
    return None


def encode_body(data: bytes | bytearray, content_type: str) -> tuple[str, str]:
    """(body, bodyEncoding): text when the content type says text and it decodes, else base64; an
    empty body (a 204, a HEAD) is the empty text whatever its content type. A bytearray `data` is
    emptied once its base64 is written (a body of up to 64 MiB need not outlive it)."""
    if not data:
        return "", "text"
    charset = _charset(content_type)
    if charset is not None:
        try:
            return data.decode(charset), "text"
        except (UnicodeDecodeError, LookupError):
            pass
    encoded = base64.b64encode(data)
    if isinstance(data, bytearray):
        data.clear()
    return encoded.decode("ascii"), "base64"


ACCEPT_ENCODING = "gzip, deflate"
"""The codings asked for unless the input sets `Accept-Encoding`: the ones decoded with a bound."""


class _NoCookies(httpx.Cookies):
    """A jar that keeps no cookie: one client serves every run, namespace and toolset, so a cookie
    a server set in one call's response must not go with another's request. A caller that wants
    a session sends its own `Cookie` header. It does not even look at a response: httpx's
    `extract_cookies` copies the request's headers through a lookup per header, quadratic in
    their count (40,000 headers held the event loop 55 s)."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None


class _CookielessClient(httpx.AsyncClient):
    """An httpx client whose jar is `_NoCookies` (httpx copies any jar it is given into its own)."""

    _jar = _NoCookies()

    @property
    def cookies(self) -> httpx.Cookies:
        return self._jar

    @cookies.setter
    def cookies(self, cookies: Any) -> None:
        raise TypeError("http.fetch keeps no cookies")


def _origin(parts: Any) -> tuple[str, str]:
    return parts.scheme, parts.netloc


class HttpExecutor:
    """Runs `http.fetch` attempts."""

    def __init__(
        self,
        *,
        max_body: int,
        max_redirects: int,
        egress: EgressPolicy | None = None,
        client: httpx.AsyncClient | None = None,
        resolver: Resolver | None = None,
        verify: ssl.SSLContext | bool = True,
        max_headers: int = MAX_HEADERS,
        max_header_bytes: int = MAX_HEADER_BYTES,
    ) -> None:
        """`egress`: where connections may go (default: public addresses only)."""
        if client is None:
            transport = httpx.AsyncHTTPTransport(verify=verify)
            guard_transport(transport, GuardedBackend(egress or EgressPolicy(), resolver))
            client = _CookielessClient(
                transport=transport,
                follow_redirects=False,
                timeout=httpx.Timeout(None, connect=10.0),
                trust_env=False,
            )
        self._client = client
        self._max_headers = max_headers
        self._max_header_bytes = max_header_bytes
        self._max_body = max_body
        self._max_redirects = max_redirects
        self._allow: Lru[str, AllowList] = Lru(ALLOW_LISTS)

    async def aclose(self) -> None:
        await self._client.aclose()

    def allow_list(self, toolset_id: str, entries: list[str]) -> AllowList:
        hit = self._allow.get(toolset_id)
        if hit is None:
            hit = AllowList(entries)
            self._allow.put(toolset_id, hit)
        return hit

    async def execute(self, attempt: Attempt) -> Any:
        allow = self.allow_list(attempt.call.toolset_id, list(attempt.http_allow))
        inp = attempt.input
        method = str(inp.get("method") or "GET").upper()
        body: str | None = inp.get("body")
        headers = checked_headers(inp.get("headers"), self._max_headers, self._max_header_bytes)
        headers["Idempotency-Key"] = attempt.call.idempotency_key.encode()  # printable ASCII
        if not any(k.lower() == "accept-encoding" for k in headers):
            headers["Accept-Encoding"] = ACCEPT_ENCODING.encode()
        url = str(inp["url"])
        parts = allow.check(url)
        for _ in range(self._max_redirects + 1):
            request = self._client.build_request(
                method,
                urlunsplit(parts),
                headers=[(k.encode("ascii"), v) for k, v in headers.items()],  # names: tokens
                content=body.encode() if body is not None else None,
            )
            try:
                response = await self._client.send(request, stream=True)
            except httpx.InvalidURL:
                # httpx builds the next request of every redirect, even one it does not follow,
                # and fails on a Location such as `mailto:` or `data:` (the request was answered).
                raise HostNotAllowed(
                    f"'{parts.hostname}' redirected to a location that is not an http or https URL: refused.",
                    details={"host": parts.hostname or ""},
                ) from None
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                raise Interrupted(
                    UpstreamUnreachable(f"Could not connect to '{parts.hostname}': {type(exc).__name__}."),
                    sent=False,
                ) from None
            except httpx.TransportError as exc:
                raise Interrupted(
                    UpstreamUnreachable(
                        f"The connection to '{parts.hostname}' failed before an answer: {type(exc).__name__}."
                    )
                ) from None
            try:
                status = response.status_code
                location = response.headers.get("location")
                if status in REDIRECTS and location:
                    target = allow.check(urljoin(urlunsplit(parts), location))
                    if parts.scheme == "https" and target.scheme == "http":
                        raise HostNotAllowed(
                            f"'{parts.hostname}' redirected from https to http ('{target.hostname}'): "
                            "refused, the answer would travel unencrypted.",
                            details={"host": target.hostname or ""},
                        )
                    if _origin(target) != _origin(parts):
                        headers = {k: v for k, v in headers.items() if k.lower() in CROSS_ORIGIN_HEADERS}
                    if status == 303 or (status in (301, 302) and method == "POST"):
                        method, body = ("HEAD" if method == "HEAD" else "GET"), None
                    parts = target
                    continue
                if status in INTERRUPTING:
                    raise Interrupted(UpstreamError(f"'{parts.hostname}' answered {status}."))
                data = await self._read(response, parts.hostname or "", attempt.reserve)
            finally:
                await response.aclose()
            text, encoding = encode_body(data, response.headers.get("content-type", ""))
            out_headers: dict[str, str] = {}
            for name, value in response.headers.multi_items():
                key = name.lower()
                out_headers[key] = f"{out_headers[key]}, {value}" if key in out_headers else value
            return {"status": status, "headers": out_headers, "body": text, "bodyEncoding": encoding}
        raise UpstreamError(f"More than {self._max_redirects} redirects starting at '{url[:200]}'.")

    def _too_large(self, host: str) -> OutputTooLarge:
        return OutputTooLarge(
            f"The response of '{host}' is larger than {self._max_body} bytes (the output cap).",
            details={"limit": self._max_body},
        )

    async def _read(self, response: httpx.Response, host: str, reserve: Reserve | None = None) -> bytearray:
        """The body, decoded within the cap, in one growing buffer. A large one (`LARGE_BODY`)
        waits for `reserve` first, sized as its base64 text (4/3 of it), which the output holds
        beside the body and then beside its own JSON."""
        declared = response.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self._max_body:
            raise self._too_large(host)
        content_encoding = response.headers.get("content-encoding", "")
        if len(codings(content_encoding)) > MAX_CODINGS:
            raise UpstreamError(
                f"The response of '{host}' lists {len(codings(content_encoding))} content codings; "
                f"at most {MAX_CODINGS} are taken."
            )
        decoder = BoundedDecoder(content_encoding, self._max_body)
        data = bytearray()
        try:
            if reserve is not None and declared and declared.isdigit() and int(declared) > LARGE_BODY:
                await reserve(int(declared) * 4 // 3)
                reserve = None
            async for raw in response.aiter_raw():  # raw: decoded here, within the cap
                for piece in decoder.pieces(raw):
                    data += piece
                    await asyncio.sleep(0)  # a big body decodes in turns with the other calls
                if reserve is not None and len(data) > LARGE_BODY:
                    await reserve(self._max_body * 4 // 3)
                    reserve = None
            for piece in decoder.flush_pieces():
                data += piece
        except OverLimit:
            raise self._too_large(host) from None
        except TooManyCodings:  # pragma: no cover - refused above
            raise UpstreamError(f"The response of '{host}' lists too many content codings.") from None
        except zlib.error:
            raise UpstreamError(
                f"The response of '{host}' does not decode as its Content-Encoding says."
            ) from None
        except httpx.TransportError as exc:
            raise Interrupted(
                UpstreamUnreachable(f"The connection to '{host}' failed mid-response: {type(exc).__name__}.")
            ) from None
        return data
