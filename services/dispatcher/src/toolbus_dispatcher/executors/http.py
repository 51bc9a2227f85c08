"""The built-in `http.fetch` tool: one pooled httpx client, redirects followed here so that every
hop is checked against the toolset's allow-list, bodies read with a size limit."""

from __future__ import annotations

import base64
import codecs
from collections import OrderedDict
from typing import Any
from urllib.parse import urljoin, urlunsplit

import httpx
from toolbus_contracts.errors import UpstreamError, UpstreamUnreachable

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
_CROSS_HOST_DROP = frozenset({"authorization", "cookie", "proxy-authorization"})


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


def encode_body(data: bytes, content_type: str) -> tuple[str, str]:
    """(body, bodyEncoding): text when the content type says text and it decodes, else base64."""
    charset = _charset(content_type)
    if charset is not None:
        try:
            return data.decode(charset), "text"
        except (UnicodeDecodeError, LookupError):
            pass
    return base64.b64encode(data).decode("ascii"), "base64"


class HttpExecutor:
    """Runs `http.fetch` attempts."""

    def __init__(self, *, max_body: int, max_redirects: int, client: httpx.AsyncClient | None = None) -> None:
        self._client = client or httpx.AsyncClient(
            follow_redirects=False, timeout=httpx.Timeout(None, connect=10.0), trust_env=False
        )
        self._max_body = max_body
        self._max_redirects = max_redirects
        self._allow: OrderedDict[str, AllowList] = OrderedDict()

    async def aclose(self) -> None:
        await self._client.aclose()

    def allow_list(self, toolset_id: str, entries: list[str]) -> AllowList:
        hit = self._allow.get(toolset_id)
        if hit is None:
            hit = self._allow[toolset_id] = AllowList(entries)
            while len(self._allow) > 256:
                self._allow.popitem(last=False)
        return hit

    async def execute(self, attempt: Attempt) -> Any:
        allow = self.allow_list(attempt.call.toolset_id, list(attempt.http_allow))
        inp = attempt.input
        method = str(inp.get("method") or "GET").upper()
        body: str | None = inp.get("body")
        headers = {k: v for k, v in (inp.get("headers") or {}).items() if k.lower() not in _DROP_HEADERS}
        headers["Idempotency-Key"] = attempt.call.idempotency_key
        url = str(inp["url"])
        parts = allow.check(url)
        for _ in range(self._max_redirects + 1):
            request = self._client.build_request(
                method,
                urlunsplit(parts),
                headers=headers,
                content=body.encode() if body is not None else None,
            )
            try:
                response = await self._client.send(request, stream=True)
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
                    if target.netloc != parts.netloc:
                        headers = {k: v for k, v in headers.items() if k.lower() not in _CROSS_HOST_DROP}
                    if status == 303 or (status in (301, 302) and method == "POST"):
                        method, body = ("HEAD" if method == "HEAD" else "GET"), None
                    parts = target
                    continue
                if status in INTERRUPTING:
                    raise Interrupted(UpstreamError(f"'{parts.hostname}' answered {status}."))
                data = await self._read(response, parts.hostname or "")
            finally:
                await response.aclose()
            text, encoding = encode_body(data, response.headers.get("content-type", ""))
            out_headers: dict[str, str] = {}
            for name, value in response.headers.multi_items():
                key = name.lower()
                out_headers[key] = f"{out_headers[key]}, {value}" if key in out_headers else value
            return {"status": status, "headers": out_headers, "body": text, "bodyEncoding": encoding}
        raise UpstreamError(f"More than {self._max_redirects} redirects starting at '{url[:200]}'.")

    async def _read(self, response: httpx.Response, host: str) -> bytes:
        declared = response.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self._max_body:
            raise UpstreamError(f"The response of '{host}' is larger than {self._max_body} bytes.")
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > self._max_body:
                    raise UpstreamError(f"The response of '{host}' is larger than {self._max_body} bytes.")
                chunks.append(chunk)
        except httpx.TransportError as exc:
            raise Interrupted(
                UpstreamUnreachable(f"The connection to '{host}' failed mid-response: {type(exc).__name__}.")
            ) from None
        return b"".join(chunks)
