"""Host tools: each attempt is a `HostCallTask` for the workers of the queue group
`toolbus-workers`; the worker heartbeats on `host.heartbeat.<callId>` and answers on
`host.result.<callId>`.

One wildcard subscription per process for heartbeats and one for results route messages to the
attempt waiting here; a message for an attempt that is not current is dropped. A heartbeat missing
for `heartbeatTimeout` interrupts the attempt. The task is sent as a request so that "no
responders" (no worker subscribed: the task never left) is known at once; workers need not reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from toolbus_contracts import Subjects, duration_seconds
from toolbus_contracts.errors import Timeout, ToolError, UpstreamUnreachable

from toolbus_dispatcher.executors.base import Attempt, Interrupted


@dataclass(slots=True)
class _Waiter:
    attempt: int
    result: asyncio.Future[dict[str, Any]]
    last_beat: float = field(default_factory=time.monotonic)


class HostExecutor:
    """Runs attempts of host tools and routes worker heartbeats and results to them."""

    def __init__(self, nc: NatsClient, subjects: Subjects) -> None:
        self._nc = nc
        self._subjects = subjects
        self._waiters: dict[str, _Waiter] = {}
        self._result_at = len(subjects.host_result(""))
        self._beat_at = len(subjects.host_heartbeat(""))

    async def on_heartbeat(self, msg: Msg) -> None:
        waiter = self._waiters.get(msg.subject[self._beat_at :])
        if waiter is None:
            return
        if msg.data:
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                attempt = orjson.loads(msg.data).get("attempt")
                if attempt is not None and attempt != waiter.attempt:
                    return
        waiter.last_beat = time.monotonic()

    async def on_result(self, msg: Msg) -> None:
        waiter = self._waiters.get(msg.subject[self._result_at :])
        if waiter is None or waiter.result.done():
            return
        try:
            body = orjson.loads(msg.data)
        except orjson.JSONDecodeError:
            return
        if not isinstance(body, dict) or body.get("attempt") != waiter.attempt:
            return
        waiter.result.set_result(body)

    async def execute(self, attempt: Attempt) -> Any:
        call = attempt.call
        hb = duration_seconds(attempt.tool.policy.heartbeat_timeout)
        task = {
            "callId": call.call_id,
            "attempt": attempt.number,
            "idempotencyKey": call.idempotency_key,
            "runId": call.run_id,
            "namespace": call.namespace,
            "toolsetId": call.toolset_id,
            "tool": attempt.tool.name,
            "input": attempt.input,
            "heartbeatTimeout": attempt.tool.policy.heartbeat_timeout,
        }
        waiter = _Waiter(attempt.number, asyncio.get_running_loop().create_future())
        self._waiters[call.call_id] = waiter
        send = asyncio.create_task(self._send(attempt.tool.name, orjson.dumps(task), hb))
        watch: set[asyncio.Future[Any]] = {waiter.result, send}
        try:
            while True:
                remaining = waiter.last_beat + hb - time.monotonic()
                if remaining <= 0:
                    raise Interrupted(
                        Timeout(
                            f"The worker of host tool '{attempt.tool.name}' missed its heartbeat "
                            f"for {attempt.tool.policy.heartbeat_timeout}."
                        )
                    )
                done, _ = await asyncio.wait(watch, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                if waiter.result.done():
                    body = waiter.result.result()
                    break
                if send in done:
                    watch.discard(send)
                    if not send.result():
                        raise Interrupted(
                            UpstreamUnreachable(
                                f"No worker is subscribed for host tool '{attempt.tool.name}'."
                            ),
                            sent=False,
                        )
        finally:
            if self._waiters.get(call.call_id) is waiter:
                del self._waiters[call.call_id]
            if not send.done():
                send.cancel()
        error = body.get("error")
        if error is not None:
            message = error.get("message") if isinstance(error, dict) else None
            raise ToolError(str(message or "the host tool reported an error")[:2000])
        return body.get("output")

    async def _send(self, tool: str, data: bytes, hb: float) -> bool:
        """Send the task; False only when no worker is subscribed (never sent)."""
        try:
            await self._nc.request(self._subjects.host_call(tool), data, timeout=min(hb, 2.0))
        except NoRespondersError:
            return False
        except (TimeoutError, NatsTimeout):
            return True
        return True
