"""toolbus's MCP client: the only package that imports `mcp` and `httpx2`.

    pool = McpPool()
    conn = await pool.get(url, headers, server_name="github")
    tools = await conn.list_tools()
    result = await conn.call_tool("list_issues", {...}, idempotency_key=key, timeout=300.0,
                                  input_schema=pinned_input_schema)  # optional: Mcp-Param-* headers

On 2026-07-28 servers (stateless) a tool call or a page of `tools/list` is one POST sent by this
package (`_fast_call`, on its own keep-alive HTTP/1.1 pool `_http1`), the same request the SDK
sends; 2025-era sessions go through `mcp.Client`.

Failures are the contract's exceptions from `toolbus_contracts.errors` (`UpstreamUnreachable`,
`Timeout`, `UpstreamError`, `CredentialsRejected`), each with `details["server"]`; a tool's own
error result is `ToolResult(is_error=True)`, not an exception.

`call_tool(..., reserve=...)` bounds memory: an answer over `LARGE_BODY` bytes is not read on until
`await reserve(size)` returns (its declared length, else the output cap when none is declared).
"""

from toolbus_mcp_client._connection import IDEMPOTENCY_META_KEY, McpConnection, ToolResult
from toolbus_mcp_client._egress import EgressCheck
from toolbus_mcp_client._pool import McpPool
from toolbus_mcp_client._transport import IDEMPOTENCY_HEADER, LARGE_BODY, Reserve

__all__ = [
    "IDEMPOTENCY_HEADER",
    "IDEMPOTENCY_META_KEY",
    "LARGE_BODY",
    "EgressCheck",
    "McpConnection",
    "McpPool",
    "Reserve",
    "ToolResult",
]
