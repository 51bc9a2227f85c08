"""Executors: how one attempt of a call reaches its tool (MCP, host worker, http, workflow)."""

from toolbus_dispatcher.executors.base import Attempt, Executor, Interrupted, NeedsCredentials

__all__ = ["Attempt", "Executor", "Interrupted", "NeedsCredentials"]
