"""Calls through the gateway: `calls.invoke` on the dispatcher, watched while it is in flight, and
its outcome as an MCP `CallToolResult`.

A call is one `calls.invoke` (one request for a call that finishes within the watch interval).
One still in flight after it is looked at every interval: `calls.start` with the same
idempotency key gives its callId (the same call, never a second one), then `calls.get` its state:
waiting for approval sends a progress notification (where the client asked for progress);
parked on expired credentials answers at once with a tool error saying where to renew them (the
call stays parked and is sent again when they are set)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
import orjson
from nats.js import JetStreamContext
from pydantic import TypeAdapter
from toolbus_contracts import Subjects
from toolbus_contracts.errors import Timeout, ToolbusError

from toolbus_gateway.requests import Requester

log = logging.getLogger(__name__)

Progress = Callable[[float, str], Awaitable[None]]

META_RUN = "toolbus/runId"
META_CALL = "toolbus/callId"
META_ERROR = "toolbus/error"

_CONTENT_BLOCK: TypeAdapter[types.ContentBlock] = TypeAdapter(types.ContentBlock)


class Parked(Exception):
    """The call waits for new credentials: answer the client now."""

    def __init__(self, call_id: str, idempotency_key: str) -> None:
        super().__init__(call_id)
        self.call_id = call_id
        self.idempotency_key = idempotency_key


class Calls:
    """Runs and calls on the dispatcher, for the gateway's MCP handlers."""

    def __init__(
        self,
        requester: Requester,
        js: JetStreamContext,
        subjects: Subjects,
        *,
        watch_interval: float,
        call_timeout: float,
    ) -> None:
        self._req = requester
        self._js = js
        self._s = subjects
        self._watch = watch_interval
        self._timeout = call_timeout

    async def open_run(self, toolset_id: str, namespace: str, run_id: str) -> str:
        body = {"toolsetId": toolset_id, "namespace": namespace, "runId": run_id}
        data = await self._req.request(self._s.runs_open, body)
        return str(data["runId"])

    async def close_run(self, run_id: str) -> None:
        await self._req.request(self._s.runs_close, {"runId": run_id})

    async def invoke(
        self,
        run_id: str,
        tool: str,
        arguments: dict[str, Any],
        progress: Progress | None,
        *,
        idempotency_key: str | None = None,
        stop_when_parked: bool = True,
    ) -> dict[str, Any]:
        """The `calls.invoke` reply (`callId`, `outcome`) once the call is done; `Parked` when it
        waits for credentials (unless `stop_when_parked` is false: then it waits on); a refused
        request raises its `ToolbusError`. The same `idempotency_key` again waits for the same call."""
        key = idempotency_key or uuid.uuid4().hex
        body = {"runId": run_id, "tool": tool, "input": arguments, "idempotencyKey": key}
        task = asyncio.create_task(
            self._req.request(self._s.calls_invoke, body, timeout=self._timeout), name="gateway-invoke"
        )
        try:
            done, _ = await asyncio.wait({task}, timeout=self._watch)
            if done:
                return task.result()
            call_id = str((await self._req.request(self._s.calls_start, body))["callId"])
            ticks = 0
            while True:
                done, _ = await asyncio.wait({task}, timeout=self._watch)
                if done:
                    return task.result()
                state = (await self._req.request(self._s.calls_get, {"callId": call_id}))["state"]
                if state == "parked" and stop_when_parked:
                    raise Parked(call_id, key)
                if progress is not None and state != "done":
                    ticks += 1
                    await progress(ticks, _STATE_WORDS.get(state, state))
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def output(self, outcome: dict[str, Any], call_id: str) -> Any:
        """An ok outcome's output, read from the object store where it is stored by reference."""
        if "outputRef" in outcome and "output" not in outcome:
            ref = outcome["outputRef"]
            store = await self._js.object_store(str(ref["bucket"]))
            result = await store.get(str(ref["name"]))
            return orjson.loads(result.data or b"null")
        return outcome.get("output")


_STATE_WORDS = {
    "awaitingApproval": "awaiting approval",
    "waitingSlot": "waiting for a free slot",
    "queued": "queued",
    "running": "running",
}


def result_meta(run_id: str, call_id: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {META_RUN: run_id}
    if call_id is not None:
        meta[META_CALL] = call_id
    return meta


def ok_result(output: Any, meta: dict[str, Any]) -> types.CallToolResult:
    """An output as MCP content: an object is `structuredContent` and its JSON as text; an MCP
    tool's own content blocks (`{"content": [...]}`, a tool with no structured output) go as
    they are; any other value is JSON text."""
    if isinstance(output, dict) and set(output) == {"content"} and isinstance(output["content"], list):
        try:
            blocks = [_block(b) for b in output["content"]]
            return types.CallToolResult(content=blocks, meta=meta)
        except Exception:  # not MCP content after all: show it as JSON below
            pass
    text = orjson.dumps(output).decode()
    structured = output if isinstance(output, dict) else None
    return types.CallToolResult(
        content=[types.TextContent(text=text)], structured_content=structured, meta=meta
    )


def _block(raw: Any) -> types.ContentBlock:
    return _CONTENT_BLOCK.validate_python(raw)


def error_result(code: str, message: str, meta: dict[str, Any]) -> types.CallToolResult:
    """A failed call as a tool error the model can read: what happened, in words, and the code."""
    text = _ERROR_WORDS.get(code, "{code}: {message}").format(code=code, message=message)
    return types.CallToolResult(
        content=[types.TextContent(text=text)],
        is_error=True,
        meta={**meta, META_ERROR: {"code": code, "message": message}},
    )


_ERROR_WORDS = {
    "denied": "denied: the call was not approved, so the tool did not run. Reason: {message}",
    "outcomeUnknown": (
        "outcomeUnknown: the call was interrupted after it was sent, so the tool may or may not "
        "have run. Check its effect before calling it again. ({message})"
    ),
    "cancelled": "cancelled: the run was closed before the call finished. ({message})",
    "credentialsRejected": "credentialsRejected: the server refused the credentials. ({message})",
}


def parked_message(call_id: str, reconnect: str | None) -> str:
    where = (
        f"Renew them at {reconnect}"
        if reconnect
        else "Ask the user to set new credentials for this server (toolbus namespaces credentials set)"
    )
    return (
        f"The server's credentials for this user have expired; call {call_id} is parked. {where}; "
        "the call is then sent again by itself and its result is in the run's events."
    )


def parked_result(call_id: str, reconnect: str | None, meta: dict[str, Any]) -> types.CallToolResult:
    return error_result("credentialsExpired", parked_message(call_id, reconnect), meta)


def refused_result(exc: ToolbusError, meta: dict[str, Any]) -> types.CallToolResult:
    """A request the dispatcher refused (bad input, ...) as a tool error."""
    if isinstance(exc, Timeout):
        return error_result(
            "timeout", f"{exc.message} The call goes on; its outcome is in the run's events.", meta
        )
    return error_result(exc.code.value, exc.message, meta)
