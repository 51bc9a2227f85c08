"""MCP tools: one `tools/call` through the pooled `toolbus_mcp_client` connection of the server and
credential set, with the idempotency key in the `Idempotency-Key` header and in `_meta`.

The credential headers are resolved first (from memory, or from Redis on a cache miss such as a
run's first call). A Redis fault there is a store step like the others: waited out with backoff
(0.05 s doubling to 2 s) within the attempt's timeout, never the call's outcome, and the attempt
is marked unsent until resolution is done (a timeout there is an interruption with `sent=False`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from typing import Any, Protocol

from toolbus_common.credential_store import UnreadableCredentials
from toolbus_common.faults import is_backing_store_fault, is_redis_fault
from toolbus_common.outages import REDIS
from toolbus_contracts import ToolbusError
from toolbus_contracts.credentials import CredentialLevel
from toolbus_contracts.errors import CredentialsRejected, ToolError, UpstreamError
from toolbus_mcp_client import Reserve

from toolbus_dispatcher.credentials import CredentialResolver
from toolbus_dispatcher.executors.base import Attempt, Interrupted, NeedsCredentials

log = logging.getLogger(__name__)

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
        timeout: float | None,  # noqa: ASYNC109
        reserve: Reserve | None = None,
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
        attempt.progress.sending = False
        try:
            headers, level = await self._resolve(attempt)
        except UnreadableCredentials as exc:  # as good as expired: parked, nothing sent
            raise NeedsCredentials(tool.target, exc.level, version) from None
        attempt.progress.sending = True
        try:
            conn = await self._pool.get(tool.url, dict(headers), server_name=tool.target)
            result = await conn.call_tool(
                tool.remote_name,
                attempt.input,
                idempotency_key=call.idempotency_key,
                # An attempt's own timeout is the runner's timer around this whole attempt
                # (`CallRunner._run`): the connection arms none of its own then.
                timeout=None if attempt.timeout is not None else DEFAULT_TIMEOUT,
                reserve=attempt.reserve,
            )
        except CredentialsRejected as exc:
            # A 401, or a 403 asking for a larger scope (step-up): parked until new credentials.
            if exc.details.get("insufficientScope") is True:
                asked = exc.details.get("requiredScopes")
                scopes = tuple(str(s) for s in asked) if isinstance(asked, list) else ()
                raise NeedsCredentials(tool.target, level, version, scopes) from None
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

    async def _resolve(self, attempt: Attempt) -> tuple[Mapping[str, str], CredentialLevel]:
        call = attempt.call
        pause = 0.05
        while True:
            try:
                return await self._credentials.resolve(
                    call.toolset_id, call.namespace, call.run_id, attempt.tool.target
                )
            except Exception as exc:
                if not is_backing_store_fault(exc):
                    raise
                if is_redis_fault(exc):
                    REDIS.fault(exc)
                else:
                    log.warning(
                        "resolving credentials: a backing store did not answer; trying again",
                        extra={"callId": call.call_id, "error": type(exc).__name__},
                    )
            await asyncio.sleep(pause * random.uniform(0.8, 1.2))
            pause = min(pause * 2, 2.0)
