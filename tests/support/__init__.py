"""Shared helpers for toolbus tests: real MCP servers and the like."""
