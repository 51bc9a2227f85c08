"""The MCP endpoint: streamable HTTP at `/mcp/<toolsetId>` (the `mcp` package's server, both
2026-07-28 single requests and 2025-11-25 sessions), behind the bearer check, and the
protected-resource metadata (RFC 9728). Only transport here: the logic is `Gateway`'s."""

from __future__ import annotations

import contextvars
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import mcp_types as types
import orjson
from mcp.server import Server, ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from opentelemetry import trace
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send
from toolbus_contracts.errors import ToolbusError
from toolbus_contracts.names import TOOLSET_ID

from toolbus_gateway.auth import Principal, Unauthenticated
from toolbus_gateway.catalogue import Catalogue
from toolbus_gateway.gateway import Gateway

log = logging.getLogger(__name__)

RESOURCE_NOT_FOUND = -32002
"""MCP's code for a resource URI the server does not have."""
SUPPORTED_VERSIONS = (*MODERN_PROTOCOL_VERSIONS, *reversed(HANDSHAKE_PROTOCOL_VERSIONS))
"""The `MCP-Protocol-Version`s the SDK's transport serves, newest first."""
STATE_KEY = "toolbus.gateway"
RUN_HEADER = "mcp-run"
SESSION_HEADER = "mcp-session-id"
_catalogue: contextvars.ContextVar[Catalogue | None] = contextvars.ContextVar(
    "gateway_catalogue", default=None
)


@dataclass(frozen=True)
class Caller:
    """What the bearer check established for one HTTP request."""

    principal: Principal
    catalogue: Catalogue
    search_mode: bool


def _caller(ctx: ServerRequestContext[Any]) -> tuple[Caller, Request]:
    request = ctx.request
    if not isinstance(request, Request) or STATE_KEY not in request.scope.get("state", {}):
        raise MCPError(types.INTERNAL_ERROR, "The request came without the gateway's bearer check.")
    caller: Caller = request.scope["state"][STATE_KEY]
    return caller, request


def build_server(gateway: Gateway) -> Server[Any]:
    async def on_list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        caller, _ = _caller(ctx)
        cursor = params.cursor if params is not None else None
        try:
            tools, next_cursor = await gateway.list_tools(
                caller.catalogue, cursor, search_mode=caller.search_mode
            )
        except ValueError:
            raise MCPError(types.INVALID_PARAMS, "The cursor is not one this listing gave.") from None
        return types.ListToolsResult(tools=tools, next_cursor=next_cursor)

    async def on_call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        caller, request = _caller(ctx)
        arguments = params.arguments
        if arguments is not None and not isinstance(arguments, Mapping):
            raise MCPError(types.INVALID_PARAMS, "'arguments' must be an object.")

        async def progress(n: float, message: str) -> None:
            await ctx.session.report_progress(n, None, message)

        async def elicit(message: str, url: str, elicitation_id: str) -> bool:
            result = await ctx.session.elicit_url(
                message, url, elicitation_id, related_request_id=ctx.request_id
            )
            return result.action == "accept"

        capabilities = ctx.session.client_capabilities
        can_elicit = (
            ctx.request_id is not None
            and capabilities is not None
            and capabilities.elicitation is not None
            and capabilities.elicitation.url is not None
            and request.headers.get(SESSION_HEADER) is not None  # a back-channel: 2025-11-25 sessions
        )
        binding = request.headers.get(SESSION_HEADER)
        try:
            return await gateway.call_tool(
                caller.principal,
                caller.catalogue,
                params.name,
                dict(arguments or {}),
                named_run=request.headers.get(RUN_HEADER),
                session=binding,
                progress=progress,
                search_mode=caller.search_mode,
                elicit=elicit if can_elicit else None,
            )
        except MCPError:
            raise
        except Exception as exc:  # a bug: logged by type and place, never with a stack trace
            log.error("tools/call failed", extra={"error": type(exc).__name__, "at": _where(exc)})
            raise MCPError(
                types.INTERNAL_ERROR, "Internal error in the gateway (a bug); its log says where."
            ) from None

    async def on_list_resources(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        caller, _ = _caller(ctx)
        cursor = params.cursor if params is not None else None
        try:
            resources, next_cursor = await gateway.directory.resources(caller.catalogue.toolset_id, cursor)
        except ValueError:
            raise MCPError(types.INVALID_PARAMS, "The cursor is not one this listing gave.") from None
        return types.ListResourcesResult(resources=resources, next_cursor=next_cursor)

    async def on_list_resource_templates(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        caller, _ = _caller(ctx)
        return types.ListResourceTemplatesResult(
            resource_templates=gateway.directory.templates(caller.catalogue.toolset_id)
        )

    async def on_read_resource(
        ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        caller, _ = _caller(ctx)
        try:
            contents = await gateway.directory.read(caller.catalogue.toolset_id, str(params.uri))
        except ToolbusError as exc:
            raise MCPError(
                types.INTERNAL_ERROR, f"The declarations could not be read: {exc.code.value}."
            ) from None
        if contents is None:
            raise MCPError(RESOURCE_NOT_FOUND, f"No resource {str(params.uri)[:200]} in this toolset.")
        return types.ReadResourceResult(contents=[contents])

    def input_schema(name: str) -> Mapping[str, Any] | None:
        catalogue = _catalogue.get()
        return None if catalogue is None else catalogue.schemas.get(name)

    server: Server[Any] = Server(
        "toolbus",
        title="toolbus gateway",
        instructions="The tools of one toolbus toolset; each call runs under the toolset's policies.",
        on_list_tools=on_list_tools,
        on_call_tool=on_call_tool,
        on_list_resources=on_list_resources,
        on_list_resource_templates=on_list_resource_templates,
        on_read_resource=on_read_resource,
        get_tool_input_schema=input_schema,
    )
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        server.middleware.clear()  # no tracer configured: the SDK's span a request records nothing
    return server


def _where(exc: BaseException) -> str:
    """The innermost frame an exception came from, `file:line`, for a log line without its trace."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return "" if tb is None else f"{tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno}"


def _json_error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": types.INVALID_REQUEST, "message": message}}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=headers)


def _unsupported_version(version: str) -> Response:
    """The SDK would route an unknown `MCP-Protocol-Version` to 2026-07-28 and complain about its
    `params._meta` envelope: say instead which versions there are."""
    message = (
        f"Unsupported protocol version {version[:40]}: this server speaks "
        f"{', '.join(MODERN_PROTOCOL_VERSIONS)} (each request carries the params._meta envelope) and "
        f"{', '.join(reversed(HANDSHAKE_PROTOCOL_VERSIONS))} (initialize, then Mcp-Session-Id)."
    )
    data = {"supported": list(SUPPORTED_VERSIONS), "requested": version[:40]}
    body = {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": types.UNSUPPORTED_PROTOCOL_VERSION, "message": message, "data": data},
    }
    return Response(orjson.dumps(body), status_code=400, media_type="application/json")


def _quoted(text: str) -> str:
    return text.replace("\\", "").replace('"', "'")


class McpEndpoint:
    """ASGI: the bearer check, the toolset, the body limit, then the MCP SDK's transport."""

    def __init__(
        self, gateway: Gateway, inner: StreamableHTTPASGIApp, *, base_url: str, max_body: int
    ) -> None:
        self._gateway = gateway
        self._inner = inner
        self._base_url = base_url
        self._max_body = max_body

    def _challenge(self, toolset_id: str, error: str | None, reason: str) -> dict[str, str]:
        parts = [
            'Bearer realm="toolbus"',
            f'resource_metadata="{self._base_url}/.well-known/oauth-protected-resource/mcp/{toolset_id}"',
        ]
        if error:
            parts += [f'error="{error}"', f'error_description="{_quoted(reason)}"']
        return {"WWW-Authenticate": ", ".join(parts)}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        toolset_id = str(scope.get("path_params", {}).get("toolset_id", ""))
        if not TOOLSET_ID.fullmatch(toolset_id):
            await _json_error(404, "No such toolset: the path is /mcp/ts_<64 hex digits>.")(
                scope, receive, send
            )
            return
        try:
            principal = await self._gateway.authenticate(request.headers.get("authorization"))
        except Unauthenticated as exc:
            headers = self._challenge(toolset_id, exc.error, exc.reason)
            await _json_error(401, exc.reason, headers)(scope, receive, send)
            return
        except Exception as exc:  # the token store (Redis) or the JWKS away: not the client's fault
            log.warning("bearer check failed", extra={"error": type(exc).__name__})
            await _json_error(503, "The gateway cannot check tokens right now; try again.")(
                scope, receive, send
            )
            return
        if not principal.may_reach(toolset_id):
            reason = "This token does not give access to this toolset."
            await _json_error(403, reason, self._challenge(toolset_id, "insufficient_scope", reason))(
                scope, receive, send
            )
            return
        version = request.headers.get("mcp-protocol-version")
        if version is not None and version not in SUPPORTED_VERSIONS:
            await _unsupported_version(version)(scope, receive, send)
            return
        length = request.headers.get("content-length")
        if length is None and scope.get("method") == "POST":  # chunked: read it here, up to the limit
            body = await _read_body(receive, self._max_body)
            if body is None:
                await _json_error(413, f"The body is over {self._max_body} bytes.")(scope, receive, send)
                return
            receive = _replay(body, receive)
        elif length is not None and length.isdigit() and int(length) > self._max_body:
            await _json_error(413, f"The body is over {self._max_body} bytes.")(scope, receive, send)
            return
        try:
            catalogue = await self._gateway.catalogue(toolset_id)
        except Exception as exc:  # the toolsets object store (NATS) away
            log.warning("toolset not read", extra={"toolsetId": toolset_id, "error": type(exc).__name__})
            await _json_error(503, "The gateway cannot read this toolset right now; try again.")(
                scope, receive, send
            )
            return
        if catalogue is None:
            await _json_error(404, f"No toolset {toolset_id} is registered.")(scope, receive, send)
            return
        mode = request.query_params.get("tools")
        search = mode == "search" or (mode != "all" and len(catalogue.tools) > self._gateway.large_toolset)
        scope.setdefault("state", {})[STATE_KEY] = Caller(principal, catalogue, search)
        token = _catalogue.set(catalogue)
        try:
            await self._inner(scope, receive, send)
        finally:
            _catalogue.reset(token)


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """A request body sent without Content-Length, or None once it is over `limit` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives `body` once, then what the connection gives (its disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def build_app(gateway: Gateway, *, base_url: str, max_body: int, host: str) -> Starlette:
    """The gateway's HTTP app (run it with its lifespan: it runs the MCP session manager)."""
    security = None
    if host in ("127.0.0.1", "localhost", "::1"):
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
    manager = StreamableHTTPSessionManager(
        app=build_server(gateway), security_settings=security, max_request_body_size=max_body
    )
    endpoint = McpEndpoint(gateway, StreamableHTTPASGIApp(manager), base_url=base_url, max_body=max_body)

    async def metadata(request: Request) -> Response:
        toolset_id = request.path_params.get("toolset_id")
        resource = f"{base_url}/mcp/{toolset_id}" if toolset_id else f"{base_url}/mcp"
        body: dict[str, Any] = {
            "resource": resource,
            "authorization_servers": gateway.authorization_servers,
            "bearer_methods_supported": ["header"],
            "resource_name": "toolbus gateway",
        }
        return JSONResponse(body, headers={"Cache-Control": "max-age=300"})

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            yield

    return Starlette(
        routes=[
            Route("/mcp/{toolset_id}", endpoint, methods=["GET", "POST", "DELETE"]),
            Route("/.well-known/oauth-protected-resource", metadata),
            Route("/.well-known/oauth-protected-resource/mcp/{toolset_id}", metadata),
        ],
        lifespan=lifespan,
    )
