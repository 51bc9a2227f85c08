"""toolbus gateway: any toolset as an MCP server."""
