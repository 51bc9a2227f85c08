"""`tools/call` and `tools/list` on a 2026-07-28 (stateless) connection in one POST each, without
the SDK client stack.

The SDK client spends most of a call's CPU on machinery a stateless call does not need (a task
and memory streams per request, pydantic JSON-RPC models both ways). This module sends the same
bytes the SDK sends and reads the answer with orjson:

- `build_call` lets the SDK session's own per-request stamp write the `_meta` envelope
  (protocol version, client info, client capabilities) and the `MCP-Protocol-Version`,
  `Mcp-Method`, `Mcp-Name` and SDK-known `Mcp-Param-*` headers, so the envelope is the SDK's by
  construction; `param_headers` adds the `Mcp-Param-*` headers of a schema the caller knows,
  built by the SDK's `mcp_param_headers`.
- `build_list` does the same for a `tools/list` page.
- `post_request` POSTs it on the connection's httpx2 client, follows a redirect only when the SDK
  would (`next_request_within_origin`), and reads a JSON or `text/event-stream` answer. It
  returns the JSON-RPC `result` object, or raises the `MCPError` the SDK's transport and
  dispatcher raise for the same answer (same code and message), so `_errors.classify` maps
  both paths alike. Network faults are recorded by the client's `WatchingTransport` as always.

The result is not validated against the protocol's pydantic models (that is the cost saved);
the caller checks the shape it uses.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final

import httpx2
import orjson
from mcp.client.streamable_http import DEFAULT_MAX_SSE_EVENT_SIZE, _unfollowed_redirect
from mcp.shared._httpx_utils import next_request_within_origin
from mcp.shared._otel import inject_trace_context
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import (
    find_invalid_x_mcp_header,
    mcp_param_headers,
    x_mcp_header_map,
)
from mcp_types import CONNECTION_CLOSED, INTERNAL_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR
from opentelemetry import context as otel_context  # opentelemetry-api comes with mcp (its inject)
from toolbus_contracts.errors import OutputTooLarge

Stamp = Callable[[dict[str, Any], CallOptions], None]
HeaderMap = dict[tuple[str, ...], str]

CALL_METHOD: Final = "tools/call"
LIST_METHOD: Final = "tools/list"
# What the SDK's `StreamableHTTPTransport._prepare_headers` puts on every POST (no session here).
_BASE_HEADERS: Final = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def header_map(input_schema: Any) -> HeaderMap:
    """The `x-mcp-header` annotations of a tool's input schema, as the SDK client reads them.

    Empty for a schema the SDK would reject (it drops such a tool and mirrors nothing).
    """
    if find_invalid_x_mcp_header(input_schema) is not None:
        return {}
    return x_mcp_header_map(input_schema)


def _dumps(message: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(message)
    except TypeError:  # orjson refuses what the stdlib takes, e.g. integers beyond 64 bits
        return json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def build_call(
    stamp: Stamp,
    request_id: int,
    name: str,
    arguments: dict[str, Any],
    meta: dict[str, Any],
    params_headers: HeaderMap | None,
) -> tuple[bytes, dict[str, str]]:
    """The body and MCP headers of one `tools/call`, as the SDK client would send them.

    `meta` is the caller's own `_meta` (the envelope keys are added to it); `params_headers`
    is the `Mcp-Param-*` map of a schema the caller knows, on top of what the SDK knows.
    """
    params: dict[str, Any] = {"name": name, "arguments": arguments, "_meta": meta}
    body, headers = _build(stamp, request_id, CALL_METHOD, params)
    if params_headers:
        headers.update(mcp_param_headers(params_headers, arguments))
    return body, headers


def build_list(stamp: Stamp, request_id: int, cursor: str | None) -> tuple[bytes, dict[str, str]]:
    """The body and MCP headers of one `tools/list` page, as the SDK client would send them."""
    return _build(stamp, request_id, LIST_METHOD, {"cursor": cursor} if cursor is not None else {})


def _build(
    stamp: Stamp, request_id: int, method: str, params: dict[str, Any]
) -> tuple[bytes, dict[str, str]]:
    data: dict[str, Any] = {"method": method, "params": params}
    opts: CallOptions = {}
    stamp(data, opts)
    meta = data["params"].setdefault("_meta", {})
    if otel_context.get_current():  # an empty context has no span and no baggage to inject
        inject_trace_context(meta)
    headers = dict(_BASE_HEADERS)
    headers.update(opts.get("headers") or {})
    message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": data["params"]}
    return _dumps(message), headers


def too_large(limit: int) -> OutputTooLarge:
    """The error of an answer longer than the output cap (reading stopped there)."""
    return OutputTooLarge(
        f"The MCP server's answer is larger than {limit} bytes (the output cap); it was not read.",
        details={"limit": limit},
    )


async def read_capped(response: httpx2.Response, limit: int | None) -> bytes | bytearray:
    """The body, read no further than `limit` bytes (`OutputTooLarge` past it); read into one
    growing buffer (orjson parses it as it is), not chunks joined at the end (twice the size)."""
    if limit is None:
        return await response.aread()
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    body = bytearray()
    async for chunk in response.aiter_bytes():
        if len(body) + len(chunk) > limit:
            raise too_large(limit)
        body += chunk
    return body


async def post_request(
    http: httpx2.AsyncClient,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    request_id: int,
    max_body: int | None = None,
) -> dict[str, Any]:
    """POST one request and return its JSON-RPC `result`; raise `MCPError` as the SDK path would
    (`OutputTooLarge` for an answer over `max_body` bytes)."""
    request = http.build_request("POST", url, content=body, headers=headers)
    followed = 0
    while True:
        response = await http.send(request, stream=True, follow_redirects=False)
        next_request = next_request_within_origin(response)
        if next_request is None or followed == http.max_redirects:
            break
        try:
            await response.aread()
        finally:
            await response.aclose()
        request = next_request
        followed += 1
    try:
        return await _read_answer(response, request_id, max_body)
    finally:
        await response.aclose()


async def _read_answer(response: httpx2.Response, request_id: int, max_body: int | None) -> dict[str, Any]:
    status = response.status_code
    if status == 202:
        raise MCPError(INVALID_REQUEST, "server answered a request with 202 Accepted")
    if (redirect := _unfollowed_redirect(response)) is not None:
        raise MCPError(INVALID_REQUEST, redirect)
    content_type = response.headers.get("content-type", "").lower()
    if status >= 400:
        if content_type.startswith("application/json"):
            error = error_of(loads(await read_capped(response, max_body)))
            if error is not None:
                raise error
        if status == 404:
            raise MCPError(METHOD_NOT_FOUND, "Not Found")
        raise MCPError(INTERNAL_ERROR, "Server returned an error response")
    if content_type.startswith("application/json"):
        body = await read_capped(response, max_body)
        message = loads(body)
        if not isinstance(message, dict):
            raise MCPError(PARSE_ERROR, "Failed to parse JSON response: not a JSON-RPC message")
        return outcome(message)
    if content_type.startswith("text/event-stream"):
        return await _read_event_stream(response, request_id, max_body)
    raise MCPError(INVALID_REQUEST, f"Unexpected content type: {content_type}")


async def _read_event_stream(
    response: httpx2.Response, request_id: int, max_body: int | None
) -> dict[str, Any]:
    """The answer on an SSE response: skip notifications and other ids, stop at our response."""
    limit = DEFAULT_MAX_SSE_EVENT_SIZE if max_body is None else max_body
    try:
        async for event in httpx2.EventSource(response, max_event_size=limit):
            if event.event != "message" or not event.data:
                continue
            message = loads(event.data)
            if message is None:
                raise MCPError(PARSE_ERROR, "Failed to parse SSE message: invalid JSON")
            if not isinstance(message, dict) or not ("result" in message or "error" in message):
                continue  # a notification (progress, log) or a server request: not the answer
            answer_id = message.get("id")
            if answer_id is not None and str(answer_id) != str(request_id):
                continue
            return outcome(message)
    except httpx2.SSEError as exc:
        if max_body is not None and "byte limit" in str(exc):
            raise too_large(max_body) from None
        raise MCPError(CONNECTION_CLOSED, f"SSE stream failed: {exc}") from None
    raise MCPError(CONNECTION_CLOSED, "SSE stream ended without a response")


def loads(data: bytes | bytearray | str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def error_of(message: Any) -> MCPError | None:
    """The `MCPError` of a JSON-RPC error message, or None if `message` is not one."""
    if not isinstance(message, dict):
        return None
    error = message.get("error")
    if not isinstance(error, dict):
        return None
    code, text = error.get("code"), error.get("message")
    if not isinstance(code, int) or isinstance(code, bool) or not isinstance(text, str):
        return None
    return MCPError(code, text, error.get("data"))


def outcome(message: dict[str, Any]) -> dict[str, Any]:
    """The `result` of a JSON-RPC response, or its error raised."""
    result = message.get("result")
    if isinstance(result, dict):
        return result
    error = error_of(message)
    if error is not None:
        raise error
    raise MCPError(PARSE_ERROR, "Failed to parse JSON response: not a JSON-RPC response")
