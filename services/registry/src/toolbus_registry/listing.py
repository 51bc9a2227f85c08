"""List an MCP server's tools for registration through the one MCP client package."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolbus_mcp_client import McpConnection


async def list_server_tools(server: str, url: str, headers: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every tool the server lists (all pages). Raises `UpstreamUnreachable` or
    `CredentialsRejected` naming the server."""
    connection = await McpConnection.open(url, dict(headers), server_name=server)
    try:
        return await connection.list_tools()
    finally:
        await connection.aclose()
