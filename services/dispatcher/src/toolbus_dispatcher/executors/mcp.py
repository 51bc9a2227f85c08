"""MCP tools: one `tools/call` through the pooled `toolbus_mcp_client` connection of the server and
credential set, with the idempotency key in the `Idempotency-Key` header and in `_meta`."""

from __future__ import annotations

from typing import Any, Protocol

from toolbus_contracts import ToolbusError
from toolbus_contracts.errors import CredentialsRejected, ToolError, UpstreamError

from toolbus_dispatcher.credentials import CredentialResolver
from toolbus_dispatcher.executors.base import Attempt, Interrupted, NeedsCredentials

DEFAULT_TIMEOUT = 300.0


class ToolResultLike(Protocol):
    @property
    def is_error(self) -> bool: ...
    @property
    def structured_content(self) -> Any: ...
    @property
    def content(self) -> list[Any]: ...


class McpConnectionLike(Protocol):
    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        idempotency_key: str,
        timeout: float,  # noqa: ASYNC109
    ) -> ToolResultLike: ...


class McpPoolLike(Protocol):
    async def get(self, url: str, headers: dict[str, str], *, server_name: str) -> McpConnectionLike: ...


def _jsonable(block: Any) -> Any:
    dump = getattr(block, "model_dump", None)
    if callable(dump):
        return dump(mode="json", by_alias=True, exclude_none=True)
    return block


def _error_text(result: ToolResultLike) -> str:
    for block in result.content or []:
        text = getattr(block, "text", None) if not isinstance(block, dict) else block.get("text")
        if isinstance(text, str) and text:
            return text[:500]
    return "the tool reported an error"


class McpExecutor:
    """Runs attempts of MCP tools; maps transport faults to interruptions and 401 to parking."""

    def __init__(self, pool: McpPoolLike, credentials: CredentialResolver) -> None:
        self._pool = pool
        self._credentials = credentials

    async def execute(self, attempt: Attempt) -> Any:
        call, tool = attempt.call, attempt.tool
        if tool.url is None:
            raise UpstreamError(f"MCP tool '{tool.name}' has no server url pinned.")
        version = self._credentials.seen_version()
        headers, level = await self._credentials.resolve(
            call.toolset_id, call.namespace, call.run_id, tool.target
        )
        try:
            conn = await self._pool.get(tool.url, dict(headers), server_name=tool.target)
            result = await conn.call_tool(
                tool.remote_name,
                attempt.input,
                idempotency_key=call.idempotency_key,
                timeout=attempt.timeout or DEFAULT_TIMEOUT,
            )
        except CredentialsRejected as exc:
            if exc.details.get("status") == 401:
                raise NeedsCredentials(tool.target, level, version) from None
            raise CredentialsRejected(
                f"MCP server '{tool.target}' refused the {level} credentials (403).",
                details={"server": tool.target, "level": level},
            ) from None
        except ToolbusError as exc:
            if exc.retryable:
                raise Interrupted(exc, sent=exc.details.get("sent", True) is not False) from None
            raise
        if result.is_error:
            raise ToolError(_error_text(result))
        if result.structured_content is not None:
            return result.structured_content
        return {"content": [_jsonable(b) for b in result.content or []]}
