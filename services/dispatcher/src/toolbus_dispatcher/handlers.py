"""The dispatcher's subjects: parse the body, call the service, reply. Nothing else."""

from __future__ import annotations

import logging
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from toolbus_common.faults import is_backing_store_fault, unavailable
from toolbus_common.rpc import RpcServer, encode_error
from toolbus_contracts import (
    CallGetReply,
    CallGetRequest,
    CallStartRequest,
    RunCloseReply,
    RunCloseRequest,
    RunOpenReply,
    RunOpenRequest,
    Subjects,
    ToolbusError,
    parse_body,
)
from toolbus_contracts.errors import Internal
from toolbus_contracts.internal import ApprovalDecided, CallsResume

from toolbus_dispatcher.calls import reply_body
from toolbus_dispatcher.service import DispatcherService

log = logging.getLogger(__name__)

QUEUE = "toolbus-dispatcher"


class Handlers:
    def __init__(self, service: DispatcherService, nc: NatsClient) -> None:
        self._service = service
        self._nc = nc

    async def handle_runs_open(self, req: RunOpenRequest) -> RunOpenReply:
        return await self._service.open_run(req)

    async def handle_runs_close(self, req: RunCloseRequest) -> RunCloseReply:
        return await self._service.close_run(req)

    async def handle_calls_start(self, req: CallStartRequest) -> dict[str, Any]:
        started = await self._service.start_call(req)
        return {"callId": started.call_id, "idempotencyKey": started.idempotency_key}

    async def handle_calls_get(self, req: CallGetRequest) -> CallGetReply:
        return await self._service.get_call(req)

    async def handle_calls_invoke(self, msg: Msg) -> None:
        """Store the call with the reply subject; whichever replica finishes it answers there."""
        try:
            req = parse_body(CallStartRequest, msg.data)
            started = await self._service.start_call(req, msg.reply or "", run_here=True)
        except ToolbusError as exc:
            if msg.reply:
                await self._nc.publish(msg.reply, encode_error(exc))
            return
        except Exception as exc:
            if is_backing_store_fault(exc):  # Redis or JetStream did not answer (e.g. a failover)
                log.warning("calls.invoke unavailable", extra={"error": type(exc).__name__})
                if msg.reply:
                    await self._nc.publish(msg.reply, encode_error(unavailable(exc)))
                return
            log.exception("calls.invoke failed")
            if msg.reply:
                await self._nc.publish(
                    msg.reply, encode_error(Internal("toolbus failed to handle this request; it was logged."))
                )
            return
        if started.outcome_json is not None and msg.reply:
            await self._nc.publish(
                msg.reply, reply_body(started.call_id, started.idempotency_key, started.outcome_json)
            )

    async def handle_approval_decided(self, data: bytes) -> None:
        await self._service.apply_decision(parse_body(ApprovalDecided, data))

    async def handle_calls_resume(self, data: bytes) -> None:
        await self._service.apply_resume(parse_body(CallsResume, data))

    def register(self, rpc: RpcServer, subjects: Subjects) -> None:
        rpc.route(subjects.runs_open, RunOpenRequest, self.handle_runs_open)
        rpc.route(subjects.runs_close, RunCloseRequest, self.handle_runs_close)
        rpc.route(subjects.calls_start, CallStartRequest, self.handle_calls_start)
        rpc.route(subjects.calls_get, CallGetRequest, self.handle_calls_get)
        rpc.raw(subjects.calls_invoke, self.handle_calls_invoke, queue=QUEUE)
