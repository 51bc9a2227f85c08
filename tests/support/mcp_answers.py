"""HTTP answers an MCP server rarely gives on demand, with the `MCPError` the SDK's streamable
HTTP transport raises for each: one table for both fast-path HTTP stacks' tests."""

from __future__ import annotations

from typing import Any

import orjson
from mcp_types import CONNECTION_CLOSED, INTERNAL_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR

RESULT = {"content": [{"type": "text", "text": "ok"}], "isError": False}


def sse(*messages: Any) -> bytes:
    return b"".join(b"event: message\ndata: " + orjson.dumps(m) + b"\n\n" for m in messages)


NOT_A_RESULT_FIELDS = ("status", "body", "content_type", "code", "message")
"""(HTTP status, body, content type, the MCPError code, its message or None for any)."""
NOT_A_RESULT = [
    (200, sse({"jsonrpc": "2.0", "method": "notifications/message", "params": {}}), "text/event-stream",
     CONNECTION_CLOSED, "SSE stream ended without a response"),
    (200, b"event: message\ndata: {not json\n\n", "text/event-stream", PARSE_ERROR, None),
    (202, b"", "application/json", INVALID_REQUEST, "server answered a request with 202 Accepted"),
    (200, b"<html>", "text/html", INVALID_REQUEST, "Unexpected content type: text/html"),
    (200, b'{"jsonrpc": "2.0", "id": 7', "application/json", PARSE_ERROR, None),
    (400, orjson.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32020, "message": "mismatch"}}),
     "application/json", -32020, "mismatch"),
    (404, b"nothing here", "text/plain", METHOD_NOT_FOUND, "Not Found"),
    (500, b'{"detail": "oops"}', "application/json", INTERNAL_ERROR, "Server returned an error response"),
]  # fmt: skip
NOT_A_RESULT_IDS = [
    "sse-ends",
    "sse-bad-json",
    "202",
    "content-type",
    "bad-json",
    "400-rpc-error",
    "404",
    "500-json",
]
