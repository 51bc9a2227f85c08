"""Real MCP servers over streamable HTTP for tests and benches.

`McpTestServer` serves a low-level `mcp.server.Server` with uvicorn on a free 127.0.0.1 port,
in a thread of its own (so a hanging tool never blocks the test's event loop). Around the MCP app
sits a small ASGI layer that records every `tools/call` it receives (arguments, the
`Idempotency-Key` header, `_meta["toolbus/idempotencyKey"]`) and injects the faults a test asks
for: an HTTP status instead of an answer, a dropped connection, a hang, a delay, a bearer token
that must match.

    async with McpTestServer(tools=echo_tools(), handler=echo_handler) as server:
        server.add_fault(Fault(status=503))       # the next tools/call answers 503
        ...                                        # server.url, server.calls

Ready-made: `echo_server()`, `paging_server()`, `token_server()`, `synthetic_server(n)`.
Run `python -m tests.support.mcp_servers --tools 100` to serve one from a shell or a bench.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import socket
import threading
import time
import zlib
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError

IDEMPOTENCY_META_KEY = "toolbus/idempotencyKey"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Guard = Callable[[str, str, dict[str, str], bytes], "tuple[int, dict[str, str], bytes] | None"]
"""`guard(method, path, headers, body)`: an answer (status, headers, body) to send instead of the
MCP server's, or None to serve the request (an OAuth resource server's checks, tests/support/oauth.py)."""
ToolHandler = Callable[[str, dict[str, Any]], Awaitable[Any]]
"""`handler(tool_name, arguments)`: return a `CallToolResult`, or any JSON value, which becomes
the result's `structuredContent` (and its JSON text the one text content block)."""


@dataclass(frozen=True)
class CallRecord:
    """One `tools/call` request as the server received it (faulted ones included)."""

    tool: str
    arguments: dict[str, Any]
    idempotency_key_header: str | None
    idempotency_key_meta: str | None
    authorized: bool


@dataclass(frozen=True)
class Fault:
    """What to do to one `tools/call` instead of answering it normally.

    - `status`: answer this HTTP status (e.g. 503, 500, 404) without running the tool.
    - `drop`: run the tool, then abort the connection without sending its answer.
    - `hang`: never answer (until the client gives up or the server stops).
    - `delay`: wait this many seconds, then answer normally.
    - `gzip_text`: answer, without running the tool, a gzip-compressed JSON result (sent with
      `Content-Encoding: gzip` whatever the request accepts) whose text block is this many `a`s
      decoded: 100 MB of it is ~100 KB on the wire (a "gzip bomb").
    """

    status: int | None = None
    drop: bool = False
    hang: bool = False
    delay: float = 0.0
    gzip_text: int = 0


class _DropConnection(Exception):
    """Raised inside the ASGI app after a partial response, so uvicorn aborts the connection."""


def echo_tools() -> list[dict[str, Any]]:
    """`echo` (structured), `plain` (text only), `fail` (an `isError` result)."""
    text_schema = {
        "type": "object",
        "properties": {"text": {"type": "string", "description": "What to send back."}},
        "required": ["text"],
    }
    return [
        {
            "name": "echo",
            "title": "Echo",
            "description": "Return the text it was given.",
            "inputSchema": text_schema,
            "outputSchema": text_schema,
            "annotations": {"readOnlyHint": True, "idempotentHint": True},
        },
        {"name": "plain", "description": "Return the text as a text block only.", "inputSchema": text_schema},
        {"name": "fail", "description": "Always report a tool error.", "inputSchema": text_schema},
    ]


async def echo_handler(name: str, arguments: dict[str, Any]) -> Any:
    """The behaviour of `echo_tools()`; any other listed tool echoes its arguments."""
    if name == "echo":
        return {"text": arguments.get("text", "")}
    if name == "plain":
        return types.CallToolResult(content=[types.TextContent(text=str(arguments.get("text", "")))])
    if name == "fail":
        return types.CallToolResult(
            content=[types.TextContent(text=f"failed on purpose: {arguments.get('text', '')}")], is_error=True
        )
    return {"arguments": arguments}


def synthetic_tools(n: int, *, prefix: str = "op") -> list[dict[str, Any]]:
    """`n` tools with schemas shaped like real ones (~1 KB each: nested objects, enums, arrays)."""
    tools = []
    for i in range(n):
        tools.append(
            {
                "name": f"{prefix}_{i:04d}",
                "title": f"Operation {i}",
                "description": (
                    f"Run operation {i} on a repository item. Returns the item as it is afterwards, "
                    "with its labels and assignees."
                ),
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "owner": {"type": "string", "description": "Repository owner."},
                        "repo": {"type": "string", "description": "Repository name."},
                        "number": {"type": "integer", "minimum": 1, "description": "Item number."},
                        "state": {"type": "string", "enum": ["open", "closed"], "description": "New state."},
                        "labels": {"type": "array", "items": {"type": "string"}, "maxItems": 20},
                        "options": {
                            "type": "object",
                            "properties": {
                                "notify": {"type": "boolean", "default": False},
                                "reason": {"type": "string", "maxLength": 500},
                            },
                            "additionalProperties": False,
                        },
                    },
                    "required": ["owner", "repo", "number"],
                },
                "outputSchema": {
                    "type": "object",
                    "properties": {
                        "arguments": {"type": "object"},
                    },
                    "required": ["arguments"],
                },
                "annotations": {"readOnlyHint": i % 2 == 0, "destructiveHint": False},
            }
        )
    return tools


def _listening_socket(port: int = 0) -> socket.socket:
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets that say they are TCP,
    # and without it every response waits ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


class McpTestServer:
    """A real MCP server over streamable HTTP on a free 127.0.0.1 port, with fault injection.

    `tools` are wire-form tool dicts (camelCase); `handler(name, arguments)` answers calls;
    `page_size` pages `tools/list`; `required_token` makes every request without
    `Authorization: Bearer <token>` get 401 (assign `server.required_token` to rotate it);
    `port` 0 picks a free one, and a stopped server starts again on the same port (a restart).
    `instructions` and `title` are what it says of itself when a client connects.
    `legacy` makes it a 2025-era server: it refuses the 2026 `server/discover` probe (HTTP 400, as
    a server that does not know the method may), so clients fall back to `initialize` and
    sessions (protocol 2025-11-25); `initializations` counts the `initialize` requests it got.
    Everything a test reads (`calls`) or sets (`required_token`, `call_delay`, `add_fault`)
    may be used from any thread.
    """

    def __init__(
        self,
        tools: list[dict[str, Any]] | None = None,
        handler: ToolHandler | None = None,
        *,
        name: str = "toolbus-test",
        page_size: int | None = None,
        required_token: str | None = None,
        json_response: bool = False,
        port: int = 0,
        legacy: bool = False,
        instructions: str | None = None,
        title: str | None = None,
        guard: Guard | None = None,
    ) -> None:
        self.name = name
        self.instructions = instructions
        self.title = title
        self.guard = guard
        self.tools = echo_tools() if tools is None else tools  # a property: reassign to change them
        self.handler = handler or echo_handler
        self.page_size = page_size
        self.required_token = required_token
        self.call_delay = 0.0
        self.calls: list[CallRecord] = []
        self.list_requests = 0
        self._faults: deque[Fault] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._json_response = json_response
        self.legacy = legacy
        self.initializations = 0
        self._thread: threading.Thread | None = None
        self._uvicorn: uvicorn.Server | None = None
        self.port = port

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools served; assigning new ones changes what the running server lists."""
        return self._tools

    @tools.setter
    def tools(self, tools: list[dict[str, Any]]) -> None:
        models = [types.Tool.model_validate(t) for t in tools]
        self._tools = tools
        self._tool_models = models
        self._schemas = {t.name: t.input_schema for t in models}

    @property
    def url(self) -> str:
        """The MCP endpoint, `http://127.0.0.1:<port>/mcp`."""
        return f"http://127.0.0.1:{self.port}/mcp"

    def add_fault(self, fault: Fault, times: int = 1) -> None:
        """Apply `fault` to the next `times` `tools/call` requests (after any queued before)."""
        with self._lock:
            self._faults.extend([fault] * times)

    def calls_to(self, tool: str) -> list[CallRecord]:
        """The recorded calls of one tool, in arrival order."""
        return [c for c in list(self.calls) if c.tool == tool]

    async def wait_for_calls(self, count: int, *, within: float = 10.0) -> list[CallRecord]:
        """Wait until at least `count` tools/call requests have arrived; return them all."""
        deadline = time.monotonic() + within
        # The server runs in another thread and loop, so poll rather than share an asyncio.Event.
        while len(self.calls) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: {len(self.calls)} of {count} calls after {within:g}s")
            await asyncio.sleep(0.005)
        return list(self.calls)

    # lifecycle -------------------------------------------------------------------------------

    async def start(self) -> McpTestServer:
        """Start serving; returns once the port accepts connections."""
        await asyncio.to_thread(self.start_blocking)
        return self

    def start_blocking(self) -> None:
        """`start()` for code without an event loop."""
        sock = _listening_socket(self.port)
        self.port = sock.getsockname()[1]
        app = self._build_app()
        config = uvicorn.Config(
            app, log_config=None, log_level="warning", lifespan="on", timeout_graceful_shutdown=1
        )
        server = uvicorn.Server(config)
        self._uvicorn = server
        self._stopping.clear()
        self._thread = threading.Thread(
            target=lambda: asyncio.run(server.serve(sockets=[sock])), name=f"mcp-{self.name}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"MCP test server {self.name} did not start")
            time.sleep(0.005)

    async def stop(self) -> None:
        """Stop serving and release hanging calls; returns once the thread has ended."""
        await asyncio.to_thread(self.stop_blocking)

    def stop_blocking(self) -> None:
        """`stop()` for code without an event loop."""
        self._stopping.set()
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._thread = None
        self._uvicorn = None

    async def __aenter__(self) -> McpTestServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # the MCP app -----------------------------------------------------------------------------

    def _build_app(self) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
        async def on_list_tools(
            ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
        ) -> types.ListToolsResult:
            self.list_requests += 1
            tool_models = self._tool_models
            if self.page_size is None:
                return types.ListToolsResult(tools=tool_models)
            start = int(params.cursor) if params is not None and params.cursor else 0
            end = start + self.page_size
            next_cursor = str(end) if end < len(tool_models) else None
            return types.ListToolsResult(tools=tool_models[start:end], next_cursor=next_cursor)

        async def on_call_tool(
            ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
        ) -> types.CallToolResult:
            if params.name not in self._schemas:
                raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name}")
            result = await self.handler(params.name, dict(params.arguments or {}))
            if isinstance(result, types.CallToolResult):
                return result
            return types.CallToolResult(
                content=[types.TextContent(text=json.dumps(result))], structured_content=result
            )

        # Without get_tool_input_schema the SDK server runs on_list_tools on every call (to check
        # Mcp-Param-* headers), which costs ~4 ms per call with 100 tools.
        server: Server[Any] = Server(
            self.name,
            title=self.title,
            instructions=self.instructions,
            on_list_tools=on_list_tools,
            on_call_tool=on_call_tool,
            get_tool_input_schema=lambda name: self._schemas.get(name),
        )
        mcp_app = server.streamable_http_app(json_response=self._json_response)

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await mcp_app(scope, receive, send)
                return
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            if self.guard is not None:
                body = await _read_body(receive) if scope["method"] == "POST" else b""
                answer = self.guard(scope["method"], scope["path"], headers, body)
                if answer is not None:
                    self._record(body, headers, False)
                    status, extra, content = answer
                    await send(
                        {
                            "type": "http.response.start",
                            "status": status,
                            "headers": [(k.encode(), v.encode()) for k, v in extra.items()],
                        }
                    )
                    await send({"type": "http.response.body", "body": content})
                    return
                receive = _replay(body, receive)
            authorized = self.required_token is None or headers.get("authorization") == (
                f"Bearer {self.required_token}"
            )
            if scope["method"] != "POST":
                if not authorized:
                    await _plain(send, 401, "missing or wrong bearer token")
                    return
                await mcp_app(scope, receive, send)
                return
            body = await _read_body(receive)
            if b'"initialize"' in body:
                self.initializations += 1
            if self.legacy and b'"server/discover"' in body:
                await _plain(send, 400, "unknown method server/discover")
                return
            fault = self._record(body, headers, authorized)
            if not authorized:
                await _plain(send, 401, "missing or wrong bearer token")
                return
            if fault is not None:
                if fault.status is not None:
                    await _plain(send, fault.status, f"injected status {fault.status}")
                    return
                if fault.hang:
                    await self._hang(receive)
                    return
                if fault.delay:
                    await asyncio.sleep(fault.delay)
                if fault.gzip_text:
                    await _gzip_result(send, body, fault.gzip_text)
                    return
            if self.call_delay and _is_call(body):
                await asyncio.sleep(self.call_delay)
            replay = _replay(body, receive)
            if fault is not None and fault.drop:
                await mcp_app(scope, replay, _swallow)
                await send(
                    {
                        "type": "http.response.start",
                        "status": 200,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", b"4096")],
                    }
                )
                await send({"type": "http.response.body", "body": b'{"jsonrpc": "2.0", ', "more_body": True})
                raise _DropConnection("dropped on purpose by the test server")
            await mcp_app(scope, replay, send)

        return app

    def _record(self, body: bytes, headers: dict[str, str], authorized: bool) -> Fault | None:
        """Record a tools/call and pop the fault that applies to it (None for anything else)."""
        try:
            message = json.loads(body)
        except ValueError:
            return None
        if not isinstance(message, dict) or message.get("method") != "tools/call":
            return None
        params = message.get("params") or {}
        meta = params.get("_meta") or {}
        record = CallRecord(
            tool=str(params.get("name")),
            arguments=params.get("arguments") or {},
            idempotency_key_header=headers.get("idempotency-key"),
            idempotency_key_meta=meta.get(IDEMPOTENCY_META_KEY),
            authorized=authorized,
        )
        with self._lock:
            self.calls.append(record)
            if not authorized:
                return None
            return self._faults.popleft() if self._faults else None

    async def _hang(self, receive: Receive) -> None:
        """Answer nothing until the client disconnects or the server stops."""
        while not self._stopping.is_set():
            try:
                message = await asyncio.wait_for(receive(), 0.05)
            except TimeoutError:
                continue
            if message["type"] == "http.disconnect":
                return


def _is_call(body: bytes) -> bool:
    return b'"tools/call"' in body


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _swallow(message: Message) -> None:
    return None


async def _gzip_result(send: Send, request: bytes, size: int) -> None:
    request_id = json.dumps(json.loads(request).get("id"))
    co = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    parts = [
        co.compress(
            b'{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"' % request_id.encode()
        )
    ]
    piece = b"a" * (1 << 20)
    for start in range(0, size, len(piece)):
        parts.append(co.compress(piece[: min(len(piece), size - start)]))
    parts.append(co.compress(b'"}],"resultType":"complete"}}') + co.flush())
    body = b"".join(parts)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-encoding", b"gzip"),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _plain(send: Send, status: int, text: str) -> None:
    body = text.encode()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# ready-made servers ----------------------------------------------------------------------------


def echo_server(**kwargs: Any) -> McpTestServer:
    """`echo`, `plain` and `fail` tools."""
    return McpTestServer(tools=echo_tools(), handler=echo_handler, **kwargs)


def paging_server(n: int = 8, page_size: int = 3, **kwargs: Any) -> McpTestServer:
    """`n` synthetic tools listed `page_size` per page."""
    return McpTestServer(tools=synthetic_tools(n), page_size=page_size, **kwargs)


def token_server(token: str = "s3cret-token", **kwargs: Any) -> McpTestServer:
    """Echo tools behind `Authorization: Bearer <token>`; anything else gets 401."""
    return McpTestServer(tools=echo_tools(), handler=echo_handler, required_token=token, **kwargs)


def synthetic_server(n: int = 100, *, prefix: str = "op", **kwargs: Any) -> McpTestServer:
    """`n` synthetic tools with realistic schemas; every call echoes its arguments."""
    return McpTestServer(tools=synthetic_tools(n, prefix=prefix) + echo_tools(), **kwargs)


def main() -> None:
    """Serve a synthetic server until interrupted, printing its URL first (for benches)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--tools", type=int, default=0, help="synthetic tools besides echo")
    parser.add_argument("--prefix", default="op", help="name prefix of the synthetic tools")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    server = synthetic_server(args.tools, prefix=args.prefix)
    server.start_blocking()
    print(server.url, flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(3600)
    server.stop_blocking()


if __name__ == "__main__":
    main()
