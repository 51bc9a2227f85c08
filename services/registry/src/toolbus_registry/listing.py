"""List an MCP server's tools for registration through the one MCP client package.

The listing is bounded (`TOOLBUS_REGISTRY_MAX_LISTING_BYTES`, 64 MiB by default): each answer of
the server is read no further than that, and its pages' tools no further than that in all, so one
server cannot exhaust the registry's memory. A listing over it is the server misbehaving during
listing: `upstreamError` naming the server, like an invalid answer or endless paging.
"""

from __future__ import annotations

from collections.abc import Mapping

from toolbus_contracts.errors import OutputTooLarge, UpstreamError
from toolbus_mcp_client import EgressCheck, McpConnection

from toolbus_registry.pinning import ServerListing

DEFAULT_MAX_LISTING_BYTES = 64 * 1024 * 1024


def listing_too_large(server: str, limit: int) -> UpstreamError:
    return UpstreamError(
        f"MCP server '{server}' sent a tool listing larger than {limit} bytes "
        "(TOOLBUS_REGISTRY_MAX_LISTING_BYTES); it was not read on.",
        details={"server": server, "limit": limit},
        retryable=False,
    )


async def list_server_tools(
    server: str,
    url: str,
    headers: Mapping[str, str],
    *,
    max_bytes: int = DEFAULT_MAX_LISTING_BYTES,
    egress: EgressCheck | None = None,
) -> ServerListing:
    """Every tool the server lists (all pages), at most `max_bytes` of it, and its own account
    of itself, connecting only where `egress` allows. Raises `HostNotAllowed` (nothing sent),
    `UpstreamUnreachable`, `CredentialsRejected` or `UpstreamError`, naming the server."""
    try:
        connection = await McpConnection.open(
            url, dict(headers), server_name=server, max_body=max_bytes, egress=egress
        )
        try:
            tools = await connection.list_tools(max_bytes=max_bytes)
            return ServerListing(tools, connection.about)
        finally:
            await connection.aclose()
    except OutputTooLarge:
        raise listing_too_large(server, max_bytes) from None
