"""One live connection to one MCP server: one httpx2 client, one open `mcp.Client`, many calls.

The SDK client multiplexes: each request is its own POST on the pooled httpx2 client, answers
are matched by JSON-RPC id, so any number of `call_tool`s may run at once on one connection.
On a 2026-07-28 connection (stateless), `call_tool` and `list_tools` skip the SDK client and send
the same requests themselves (`_fast_call`) on a lean HTTP/1.1 pool (`_http1`), or on the httpx2
client where a proxy or a redirect is involved; 2025-era sessions and every other operation go
through the SDK.
The `mcp.Client` is entered and exited by a task of its own (anyio scopes must be left by the
task that entered them, and the pool's callers are many tasks). If that client ever dies, the
next operation opens a new one on the same httpx2 client.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import httpx2
import mcp_types as types
import orjson
from mcp import Client
from mcp.client.streamable_http import DEFAULT_MAX_SSE_EVENT_SIZE, streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import HEADER_MISMATCH, REQUEST_TIMEOUT
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import TypeAdapter, ValidationError
from toolbus_contracts.errors import HostNotAllowed, Timeout, ToolbusError, UpstreamError, UpstreamUnreachable

from toolbus_mcp_client._egress import EgressCheck
from toolbus_mcp_client._errors import classify, protocol_error
from toolbus_mcp_client._fast_call import (
    HeaderMap,
    build_call,
    build_list,
    header_map,
    post_request,
    too_large,
)
from toolbus_mcp_client._http1 import Http1Pool, Redirected, Unsendable
from toolbus_mcp_client._transport import Attempt, Reserve, build_http_client, current_attempt, tls_context

logger = logging.getLogger("toolbus_mcp_client")

IDEMPOTENCY_META_KEY: Final = "toolbus/idempotencyKey"
TOOL_KEYS: Final = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")
MAX_LIST_PAGES: Final = 10_000

# Results are taken as the wire dicts the SDK already validated against the negotiated protocol
# version: no second parse into models, and the tool's content reaches the caller as sent. The
# SDK types `send_request` for model results only, hence the cast.
_RAW_RESULT: Final[Any] = TypeAdapter(dict[str, Any])

Mode = Literal["auto", "legacy"]


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A tool's answer as the server gave it; `is_error` is the tool's own error, not a failure."""

    is_error: bool
    structured_content: Any | None
    content: list[dict[str, Any]] = field(default_factory=list)


def _first_mcp_error(exc: BaseException) -> MCPError | None:
    """The SDK wraps connect failures in (nested) exception groups; find the MCPError inside."""
    if isinstance(exc, MCPError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first_mcp_error(inner)
            if found is not None:
                return found
    if exc.__cause__ is not None:
        return _first_mcp_error(exc.__cause__)
    return None


class _Live:
    """One open `mcp.Client`, hosted by the task that entered it."""

    def __init__(self) -> None:
        self.client: Client | None = None
        self.stop = asyncio.Event()
        self.dead = False
        self.task: asyncio.Task[None] | None = None

    @property
    def modern(self) -> bool:
        return self.client is not None and self.client.protocol_version in MODERN_PROTOCOL_VERSIONS


def _json_size(value: Any) -> int:
    """Bytes of `value` as JSON (a listed page: parsed JSON, so always encodable)."""
    try:
        return len(orjson.dumps(value))
    except TypeError:  # an integer beyond 64 bits, which orjson refuses
        return len(json.dumps(value))


async def _check_egress(egress: EgressCheck, url: str, server_name: str) -> None:
    """`HostNotAllowed` naming the server where the egress policy refuses its URL's host (a name
    that does not resolve is left to the connection, which reports it as it does today)."""
    try:
        parsed = httpx2.URL(url)
        host, port = parsed.host, parsed.port or (443 if parsed.scheme == "https" else 80)
    except (httpx2.InvalidURL, ValueError):
        return
    try:
        await egress(host, port)
    except HostNotAllowed as exc:
        raise HostNotAllowed(
            f"MCP server '{server_name}': {exc.message}", details={**exc.details, "server": server_name}
        ) from None
    except OSError:
        pass


class McpConnection:
    """A connection to one MCP server URL with one set of credential headers.

    Safe for many concurrent `call_tool`s. Errors are the contract's exceptions (see
    `toolbus_mcp_client._errors`); a tool's own error result is a `ToolResult(is_error=True)`.
    """

    def __init__(
        self,
        url: str,
        headers: dict[str, str],
        *,
        server_name: str,
        mode: Mode = "auto",
        open_timeout: float = 30.0,
        fast_calls: bool = True,
        max_body: int | None = None,
        egress: EgressCheck | None = None,
    ) -> None:
        self.url = url
        self._egress = egress
        self._max_body = max_body
        self.server_name = server_name
        self._headers = dict(headers)
        self._mode: Mode = mode
        self._open_timeout = open_timeout
        self._fast_calls = fast_calls
        self._request_ids = itertools.count(1)
        # `Mcp-Param-*` maps by tool: from `list_tools`, and from schemas callers passed (kept
        # with the schema object, so a caller's pinned schema is walked once, not per call).
        self._listed_headers: dict[str, HeaderMap] = {}
        self._listed_schemas: dict[str, Any] = {}
        self._given_headers: dict[str, tuple[Mapping[str, Any], HeaderMap]] = {}
        self._http: httpx2.AsyncClient = build_http_client(self._headers, egress)
        # The fast path's own HTTP/1.1 connections (None: it posts through httpx2 as well).
        self._lean = (
            Http1Pool.for_url(url, self._lean_headers(), tls_context(), max_body, egress)
            if fast_calls
            else None
        )
        self._live: _Live | None = None
        self._reopen_lock = asyncio.Lock()
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.closed = False

    @classmethod
    async def open(
        cls,
        url: str,
        headers: dict[str, str],
        *,
        server_name: str,
        mode: Mode = "auto",
        timeout: float = 30.0,  # noqa: ASYNC109 - bounds the whole opening, enforced inside
        fast_calls: bool = True,
        max_body: int | None = None,
        egress: EgressCheck | None = None,
    ) -> McpConnection:
        """Connect (discover the protocol, or initialize on 2025-era servers) and return the connection.

        `fast_calls=False` sends 2026-era tool calls through the SDK client too (the two paths
        give the same results and errors; the fast one costs a fraction of the CPU).
        `max_body`: answers longer than this many bytes are not read on: `OutputTooLarge`, not
        retryable (on every path: the lean pool and httpx2 on the fast path, and the SDK's
        transport for 2025-era sessions and `fast_calls=False`, where `WatchingTransport` counts).
        `egress`: the deployment's check of where a connection may go (`_egress`); a server it
        refuses is `HostNotAllowed` before anything is sent, whether or not something listens there.
        Raises `UpstreamUnreachable`, `CredentialsRejected`, `Timeout` or `UpstreamError`, naming
        the server.
        """
        if egress is not None:
            await _check_egress(egress, url, server_name)
        conn = cls(
            url,
            headers,
            server_name=server_name,
            mode=mode,
            open_timeout=timeout,
            fast_calls=fast_calls,
            max_body=max_body,
            egress=egress,
        )
        try:
            conn._live = await conn._start()
        except BaseException:
            await conn._http.aclose()
            conn.closed = True
            raise
        return conn

    @property
    def protocol_version(self) -> str | None:
        """The protocol version the server speaks on the current connection."""
        live = self._live
        return live.client.protocol_version if live is not None and live.client is not None else None

    @property
    def about(self) -> str | None:
        """What the server says of itself on the current connection: its `instructions`, else its
        `serverInfo` title, else its description (None when it says nothing)."""
        live = self._live
        client = live.client if live is not None else None
        if client is None:
            return None
        info = client.server_info
        for text in (client.instructions, info.title if info else None, info.description if info else None):
            if text and text.strip():
                return text.strip()
        return None

    # opening and closing ---------------------------------------------------------------------

    async def _start(self) -> _Live:
        live = _Live()
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        attempt = Attempt()
        live.task = asyncio.create_task(self._host(live, ready, attempt), name=f"mcp:{self.server_name}")
        try:
            async with asyncio.timeout(self._open_timeout):
                await asyncio.shield(ready)
        except TimeoutError:
            live.task.cancel()
            with contextlib.suppress(BaseException):
                await live.task
            raise Timeout(
                f"MCP server '{self.server_name}' did not complete the connection within "
                f"{self._open_timeout:g}s; check that it is running and reachable.",
                details={"server": self.server_name, "sent": attempt.sent},
                retryable=True,
            ) from None
        except asyncio.CancelledError:
            live.task.cancel()
            raise
        except ToolbusError:
            raise
        except BaseException as exc:
            error = classify(
                self.server_name, attempt, _first_mcp_error(exc), what="the connection", timeout=None
            )
            raise error from None
        return live

    async def _host(self, live: _Live, ready: asyncio.Future[None], attempt: Attempt) -> None:
        """Enter the SDK client, hand it over, wait until told to stop, then leave it here."""
        token = current_attempt.set(attempt)
        try:
            async with AsyncExitStack() as stack:
                transport = streamable_http_client(
                    self.url,
                    http_client=self._http,
                    terminate_on_close=True,
                    # one SSE event may be as long as the cap (the transport caps each answer)
                    max_sse_event_size=self._max_body or DEFAULT_MAX_SSE_EVENT_SIZE,
                )
                client = await stack.enter_async_context(Client(transport, mode=self._mode))
                current_attempt.reset(token)
                live.client = client
                ready.set_result(None)
                await live.stop.wait()
        except asyncio.CancelledError:
            if not ready.done():
                ready.cancel()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # the SDK's task groups raise (base) exception groups
            if not ready.done():
                ready.set_exception(exc)
            else:
                logger.warning(
                    "MCP connection to server %s ended unexpectedly: %s", self.server_name, type(exc).__name__
                )
        finally:
            live.dead = True

    async def _current(self) -> _Live:
        """The open SDK client, reopened if the previous one died."""
        live = self._live
        if live is not None and not live.dead:
            return live
        if self.closed:
            raise UpstreamUnreachable(
                f"The connection to MCP server '{self.server_name}' is closed; get a new one from the pool.",
                details={"server": self.server_name, "sent": False},
                retryable=True,
            )
        async with self._reopen_lock:
            live = self._live
            if live is not None and not live.dead:
                return live
            if live is not None:
                await self._stop(live)
            self._live = await self._start()
            return self._live

    async def _stop(self, live: _Live) -> None:
        live.stop.set()
        if live.task is not None:
            with contextlib.suppress(BaseException):
                await live.task

    def cut_grace(self) -> None:
        """End a graceful `aclose` wait now: calls still in flight fail as the connection closes."""
        self._idle.set()

    async def aclose(self, *, grace: float = 0.0) -> None:
        """Close the connection; with `grace`, first wait up to that long for calls in flight."""
        if self.closed:
            return
        self.closed = True
        if grace > 0 and self._in_flight:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self._idle.wait()
        if self._live is not None:
            await self._stop(self._live)
        if self._lean is not None:
            self._lean.close()
        await self._http.aclose()

    # operations ------------------------------------------------------------------------------

    async def list_tools(
        self,
        *,
        timeout: float = 60.0,  # noqa: ASYNC109
        max_bytes: int | None = None,
    ) -> list[dict[str, Any]]:
        """Every tool the server lists, following `nextCursor` to the end, in wire (camelCase) form.

        Each dict holds the keys the server sent among name, title, description, inputSchema,
        outputSchema and annotations. `timeout` bounds each page. `max_bytes` bounds the listing:
        its pages' tools (as JSON) past that many bytes in all raise `OutputTooLarge` (each answer
        is bounded by the connection's `max_body` already).
        """
        tools: list[dict[str, Any]] = []
        total = 0
        seen: set[str] = set()
        cursor: str | None = None
        live = await self._current()
        for _ in range(MAX_LIST_PAGES):
            page = await self._list_page(live, cursor, timeout)
            raw_tools = page.get("tools")
            if not isinstance(raw_tools, list):
                raise protocol_error(self.server_name, "listing tools", "the result has no tools list")
            if max_bytes is not None:
                total += _json_size(raw_tools)
                if total > max_bytes:
                    raise too_large(max_bytes)
            tools.extend({k: t[k] for k in TOOL_KEYS if t.get(k) is not None} for t in raw_tools)
            next_cursor = page.get("nextCursor")
            if not next_cursor:
                # Header maps are worked out when a tool is first called, not for every tool listed.
                self._listed_schemas = {
                    t["name"]: t.get("inputSchema") for t in tools if isinstance(t.get("name"), str)
                }
                self._listed_headers = {}
                return tools
            if next_cursor in seen:
                raise protocol_error(self.server_name, "listing tools", "it repeated a page cursor")
            seen.add(next_cursor)
            cursor = next_cursor
        raise protocol_error(self.server_name, "listing tools", f"it listed more than {MAX_LIST_PAGES} pages")

    async def _list_page(self, live: _Live, cursor: str | None, timeout: float) -> dict[str, Any]:  # noqa: ASYNC109
        """One `tools/list` result: in one POST on a stateless connection (see `_fast_call`; the
        SDK's models cost ~3 ms a 100-tool page), else through the SDK session."""
        client = live.client
        assert client is not None
        attempt = Attempt(max_body=self._max_body)  # httpx2 paths: the transport caps (and decodes)
        token = current_attempt.set(attempt)
        try:
            if self._fast_calls and live.modern:
                request_id = next(self._request_ids)
                body, headers = build_list(client.session._stamp, request_id, cursor)
                async with asyncio.timeout(timeout):
                    return await self._post(body, headers, request_id, attempt)
            page: dict[str, Any] = await client.session.send_request(
                types.ListToolsRequest(params=types.PaginatedRequestParams(cursor=cursor)),
                _RAW_RESULT,
                request_read_timeout_seconds=timeout,
            )
            return page
        except TimeoutError:
            error = MCPError(REQUEST_TIMEOUT, "Request 'tools/list' timed out")
        except MCPError as exc:
            error = exc
        except ValidationError as exc:
            raise protocol_error(self.server_name, "listing tools", str(exc)) from None
        finally:
            current_attempt.reset(token)
        self._raise_if_too_large(attempt)
        raise classify(self.server_name, attempt, error, what="listing tools", timeout=timeout)

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        idempotency_key: str,
        timeout: float | None,  # noqa: ASYNC109 - the SDK's per-request timeout, which also aborts the POST
        input_schema: Mapping[str, Any] | None = None,
        reserve: Reserve | None = None,
    ) -> ToolResult:
        """Call one tool once. The idempotency key travels as the `Idempotency-Key` HTTP header and
        as `_meta["toolbus/idempotencyKey"]`. `timeout` bounds the wait for the answer; None arms no
        timer here, for a caller that bounds the call itself (the dispatcher's attempt timeout,
        `deadline.within` around this call: one timer per call instead of two).

        `input_schema` (e.g. the pinned one) lets a 2026-era call mirror the arguments its
        `x-mcp-header` annotations name into `Mcp-Param-*` headers on the first try; without it,
        the schemas of the last `list_tools` serve, and a server that refuses the call for
        missing headers (HEADER_MISMATCH) gets it once more after a listing.

        `reserve`: awaited before an answer over `LARGE_BODY` bytes is read on (its size: the
        declared length, else the output cap), on the lean and httpx2 paths; a 2025-era session
        reads through the same transport and reserves too.
        """
        live = self._live
        if live is None or live.dead:
            live = await self._current()
        self._in_flight += 1
        self._idle.clear()
        try:
            try:
                raw = await self._send_call(
                    live, name, arguments, idempotency_key, timeout, input_schema, reserve=reserve
                )
            except _HeadersUnknown:
                # The tool mirrors arguments into `Mcp-Param-*` headers, which the SDK stamps only
                # for tools this client listed; the server refused before running it. List, resend.
                await self._learn_tool(live, name, timeout)
                raw = await self._send_call(
                    live,
                    name,
                    arguments,
                    idempotency_key,
                    timeout,
                    input_schema,
                    header_retry=False,
                    reserve=reserve,
                )
            except _SessionLost:
                # A 2025-era server forgot our session (it restarted): the call was not run there.
                live.dead = True
                live = await self._current()
                try:
                    raw = await self._send_call(
                        live, name, arguments, idempotency_key, timeout, reserve=reserve
                    )
                except _SessionLost:
                    raise UpstreamError(
                        f"MCP server '{self.server_name}' answered HTTP 404 to the call of tool '{name}' "
                        "on a fresh session; check the server's URL.",
                        details={"server": self.server_name, "status": 404, "sent": True},
                        retryable=False,
                    ) from None
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()
        return self._tool_result(name, raw)

    async def _send_call(
        self,
        live: _Live,
        name: str,
        arguments: dict[str, Any],
        key: str,
        timeout: float | None,  # noqa: ASYNC109
        input_schema: Mapping[str, Any] | None = None,
        *,
        header_retry: bool = True,
        reserve: Reserve | None = None,
    ) -> dict[str, Any]:
        if self._fast_calls and live.modern:
            return await self._send_call_fast(
                live, name, arguments, key, timeout, input_schema, header_retry, reserve
            )
        client = live.client
        assert client is not None
        # The SDK reads whole bodies and has no cap: the transport stops this answer at the cap.
        attempt = Attempt(idempotency_key=key, max_body=self._max_body, reserve=reserve)
        token = current_attempt.set(attempt)
        request = types.CallToolRequest(
            params=types.CallToolRequestParams(
                name=name, arguments=arguments, _meta={IDEMPOTENCY_META_KEY: key}
            )
        )
        try:
            raw: dict[str, Any] = await client.session.send_request(
                request, _RAW_RESULT, request_read_timeout_seconds=timeout
            )
            return raw
        except MCPError as exc:
            self._raise_if_too_large(attempt)
            if attempt.status == 404 and not live.modern and attempt.network_error is None:
                raise _SessionLost from None
            if exc.code == HEADER_MISMATCH and header_retry and live.modern:
                raise _HeadersUnknown from None
            raise classify(
                self.server_name, attempt, exc, what=f"the call of tool '{name}'", timeout=timeout
            ) from None
        except ValidationError as exc:
            raise protocol_error(self.server_name, f"the call of tool '{name}'", str(exc)) from None
        finally:
            current_attempt.reset(token)

    async def _send_call_fast(
        self,
        live: _Live,
        name: str,
        arguments: dict[str, Any],
        key: str,
        timeout: float | None,  # noqa: ASYNC109
        input_schema: Mapping[str, Any] | None,
        header_retry: bool,
        reserve: Reserve | None = None,
    ) -> dict[str, Any]:
        """`_send_call` for a stateless connection: one POST, no SDK client (see `_fast_call`)."""
        client = live.client
        assert client is not None
        request_id = next(self._request_ids)
        # The SDK session's own stamp writes the envelope and routing headers (it is private, and
        # mcp is pinned; tests compare both paths' wire requests, so a change shows).
        body, headers = build_call(
            client.session._stamp,
            request_id,
            name,
            arguments,
            {IDEMPOTENCY_META_KEY: key},
            self._param_headers(name, input_schema),
        )
        attempt = Attempt(idempotency_key=key, reserve=reserve)
        token = current_attempt.set(attempt)
        try:
            if timeout is None:  # the caller bounds the call
                return await self._post(body, headers, request_id, attempt)
            async with asyncio.timeout(timeout):
                return await self._post(body, headers, request_id, attempt)
        except TimeoutError:
            error = MCPError(REQUEST_TIMEOUT, "Request 'tools/call' timed out")
        except MCPError as exc:
            if exc.code == HEADER_MISMATCH and header_retry:
                raise _HeadersUnknown from None
            error = exc
        finally:
            current_attempt.reset(token)
        raise classify(self.server_name, attempt, error, what=f"the call of tool '{name}'", timeout=timeout)

    def _lean_headers(self) -> dict[str, str]:
        """What the lean path sends on every request: httpx2's defaults (less `Accept-Encoding`:
        it reads bodies as they come) and the connection's credential headers. Read as the bytes
        they are sent as (Latin-1): httpx2's `items()` decodes with an encoding it guessed before
        a credential beyond ASCII was added, and raises."""
        return {
            k.decode("latin-1").lower(): v.decode("latin-1")
            for k, v in self._http.headers.raw
            if k.lower() != b"accept-encoding"
        }

    async def _post(
        self, body: bytes, headers: dict[str, str], request_id: int, attempt: Attempt
    ) -> dict[str, Any]:
        """One fast-path POST: on the lean HTTP/1.1 pool where there is one, else on httpx2 (and
        on httpx2 too when the server redirects, which it follows as the SDK does)."""
        lean = self._lean
        if lean is not None:
            hooks = self._http.event_hooks["request"]
            if hooks:  # observers of the wire (tests, tracing) see the lean requests too
                merged = {**self._lean_headers(), **headers}
                request = httpx2.Request("POST", self.url, headers=merged, content=body)
                for hook in hooks:
                    await hook(request)
            try:
                return await lean.post(body, headers, request_id, attempt)
            except Redirected:
                # this server redirects: httpx2 follows (as the SDK does) from now on
                self._lean = None
                lean.retire()
            except Unsendable:
                pass  # a header the lean path does not write: httpx2 validates and sends it
        return await post_request(self._http, self.url, body, headers, request_id, self._max_body)

    def _raise_if_too_large(self, attempt: Attempt) -> None:
        """`OutputTooLarge` (not retried) when the transport stopped an answer at the cap: the
        SDK then reports a parse error or a failed stream, which is not what happened."""
        if attempt.too_large and self._max_body is not None:
            raise too_large(self._max_body) from None

    def _param_headers(self, name: str, input_schema: Mapping[str, Any] | None) -> HeaderMap | None:
        """The `Mcp-Param-*` map for a call: from the caller's schema, else from the last listing."""
        if input_schema is None:
            listed = self._listed_headers.get(name)
            if listed is None and name in self._listed_schemas:
                listed = self._listed_headers[name] = header_map(self._listed_schemas[name])
            return listed or None
        given = self._given_headers.get(name)
        if given is None or given[0] is not input_schema:
            given = (input_schema, header_map(input_schema))
            self._given_headers[name] = given
        return given[1]

    async def _learn_tool(self, live: _Live, name: str, timeout: float | None) -> None:  # noqa: ASYNC109
        """Let the SDK list tools page by page until it has seen `name` (it keeps their headers)."""
        client = live.client
        assert client is not None
        cursor: str | None = None
        attempt = Attempt(max_body=self._max_body)
        token = current_attempt.set(attempt)
        what = f"listing tools to call '{name}'"
        try:
            for _ in range(MAX_LIST_PAGES):
                page = await client.list_tools(cursor=cursor, cache_mode="refresh")
                cursor = page.next_cursor
                if cursor is None or any(tool.name == name for tool in page.tools):
                    return
        except MCPError as exc:
            self._raise_if_too_large(attempt)
            raise classify(self.server_name, attempt, exc, what=what, timeout=timeout) from None
        except ValidationError as exc:
            raise protocol_error(self.server_name, what, str(exc)) from None
        finally:
            current_attempt.reset(token)

    def _tool_result(self, name: str, raw: dict[str, Any]) -> ToolResult:
        result_type = raw.get("resultType")
        if result_type not in (None, "complete"):
            raise UpstreamError(
                f"MCP server '{self.server_name}' asked for more input ({result_type}) to run tool "
                f"'{name}', which toolbus does not support.",
                details={"server": self.server_name, "sent": True},
                retryable=False,
            )
        content = raw.get("content")
        if not isinstance(content, list):
            raise protocol_error(
                self.server_name, f"the call of tool '{name}'", "the result has no content list"
            )
        return ToolResult(
            is_error=bool(raw.get("isError", False)),
            structured_content=raw.get("structuredContent"),
            content=content,
        )


class _HeadersUnknown(Exception):
    """HEADER_MISMATCH on a 2026 call: the tool wants `Mcp-Param-*` headers the SDK can't yet stamp."""


class _SessionLost(Exception):
    """HTTP 404 on a 2025-era session: the server no longer knows it, so open a new one."""
