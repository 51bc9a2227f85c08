"""Workflows: a request on `workflows.start.<name>` to whatever engine runs them; its reply is the
call's output (an `{"ok": ...}` envelope or bare JSON; `ok: false` is a tool error)."""

from __future__ import annotations

from typing import Any

import orjson
from nats.aio.client import Client as NatsClient
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from toolbus_contracts import Subjects
from toolbus_contracts.errors import Timeout, ToolError, UpstreamError, UpstreamUnreachable

from toolbus_dispatcher.executors.base import Attempt, Interrupted


class WorkflowExecutor:
    def __init__(self, nc: NatsClient, subjects: Subjects, *, default_timeout: float) -> None:
        self._nc = nc
        self._subjects = subjects
        self._default_timeout = default_timeout

    async def execute(self, attempt: Attempt) -> Any:
        call, tool = attempt.call, attempt.tool
        request = {
            "name": tool.target,
            "version": tool.version or "",
            "input": attempt.input,
            "parentRunId": call.run_id,
            "callId": call.call_id,
            "idempotencyKey": call.idempotency_key,
        }
        timeout = attempt.timeout or self._default_timeout
        try:
            msg = await self._nc.request(
                self._subjects.workflows_start(tool.target), orjson.dumps(request), timeout=timeout
            )
        except NoRespondersError:
            raise Interrupted(
                UpstreamUnreachable(f"No workflow engine is subscribed for workflow '{tool.target}'."),
                sent=False,
            ) from None
        except NatsTimeout:
            raise Interrupted(
                Timeout(f"Workflow '{tool.target}' did not answer within {timeout:g}s.")
            ) from None
        try:
            body = orjson.loads(msg.data)
        except orjson.JSONDecodeError:
            raise UpstreamError(
                f"Workflow '{tool.target}' answered with something that is not JSON."
            ) from None
        if (
            isinstance(body, dict)
            and isinstance(body.get("ok"), bool)
            and set(body) <= {"ok", "data", "error"}
        ):
            if body["ok"]:
                return body.get("data")
            error = body.get("error")
            message = error.get("message") if isinstance(error, dict) else None
            raise ToolError(str(message or f"Workflow '{tool.target}' failed.")[:2000])
        return body
