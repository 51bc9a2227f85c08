"""The dispatcher's subjects: parse the body, call the service, reply. Nothing else.

`calls.start` and `calls.invoke` are `fast` (raw nats-py in this process: FastStream's cost per
message is over the hot path's budget, `bench/transport.py`); the rest are FastStream subscribers.
"""

from __future__ import annotations

from nats.aio.msg import Msg
from toolbus_common.bus import RawJson, Routes
from toolbus_contracts import (
    CallEvent,
    CallGetReply,
    CallGetRequest,
    CallInvokeReply,
    CallStartReply,
    CallStartRequest,
    HostCallTask,
    HostCancel,
    HostHeartbeat,
    HostResult,
    RunCloseReply,
    RunCloseRequest,
    RunOpenReply,
    RunOpenRequest,
    WorkflowStartRequest,
)
from toolbus_contracts.internal import ApprovalDecided, ApprovalNeeded, CallParked, CallsResume, RunClosed

from toolbus_dispatcher.calls import invoke_data
from toolbus_dispatcher.executors.host import HostExecutor
from toolbus_dispatcher.service import DispatcherService

QUEUE = "toolbus-dispatcher"
DURABLE_APPROVALS = "approvals"
DURABLE_RESUME = "resume"
"""Durable consumer names, after `TOOLBUS_DISPATCHER_CONSUMER` and a dash."""

routes: Routes[DispatcherService] = Routes("dispatcher")
host_routes: Routes[HostExecutor] = Routes("dispatcher")


@routes.request(lambda s: s.runs_open)
async def handle_runs_open(service: DispatcherService, request: RunOpenRequest) -> RunOpenReply:
    """Open a run on a registered toolset (a no-op when open with the same toolset)."""
    return await service.open_run(request)


@routes.request(lambda s: s.runs_close)
async def handle_runs_close(service: DispatcherService, request: RunCloseRequest) -> RunCloseReply:
    """Close a run: unfinished calls end `cancelled`, run-level credentials are deleted."""
    return await service.close_run(request)


@routes.request(lambda s: s.calls_start, fast=True)
async def handle_calls_start(service: DispatcherService, request: CallStartRequest) -> CallStartReply:
    """Start a call; answered once it is stored durably (idempotent on runId + idempotencyKey)."""
    started = await service.start_call(request)
    return CallStartReply(call_id=started.call_id, idempotency_key=started.idempotency_key)


@routes.deferred(lambda s: s.calls_invoke, reply=CallInvokeReply)
async def handle_calls_invoke(
    service: DispatcherService, request: CallStartRequest, reply: str
) -> RawJson | None:
    """Start a call and answer with its outcome once it is done (from whichever replica finishes it)."""
    started = await service.start_call(request, reply, run_here=True)
    if started.outcome_json is None:
        return None  # stored with the reply subject: the replica that finishes the call answers
    return invoke_data(started.call_id, started.idempotency_key, started.outcome_json)


@routes.request(lambda s: s.calls_get)
async def handle_calls_get(service: DispatcherService, request: CallGetRequest) -> CallGetReply:
    """A call's state, attempts and (when done) outcome."""
    return await service.get_call(request)


@routes.command(lambda s: s.internal_approval_decisions, durable=DURABLE_APPROVALS)
async def handle_approval_decided(service: DispatcherService, decision: ApprovalDecided) -> None:
    """approval → dispatcher: apply a decision if the call still waits for exactly this one."""
    await service.apply_decision(decision)


@routes.command(lambda s: s.internal_calls_resume, durable=DURABLE_RESUME)
async def handle_calls_resume(service: DispatcherService, resume: CallsResume) -> None:
    """credentials → dispatcher: send parked calls again in order, or end them."""
    await service.apply_resume(resume)


@host_routes.listen(lambda s: s.host_heartbeats, HostHeartbeat)
async def handle_host_heartbeat(host: HostExecutor, msg: Msg) -> None:
    """A host-tool worker's heartbeat; every replica hears it, the one running the attempt uses it."""
    await host.on_heartbeat(msg)


@host_routes.listen(lambda s: s.host_results, HostResult)
async def handle_host_result(host: HostExecutor, msg: Msg) -> None:
    """A host-tool worker's result; a result for an attempt that is no longer current is dropped."""
    await host.on_result(msg)


routes.event(
    lambda s: s.call_events("{runId}", "{callId}"),
    CallEvent,
    "Every change of a call, in order; kept in the EVENTS stream to replay a run.",
)
routes.event(
    lambda s: s.host_call("{tool}"),
    HostCallTask,
    "One attempt of a host-tool call, a request to the workers' queue group `toolbus-workers` "
    "with reply subject `host.result.<callId>.<token>` (a token per attempt): the worker's result "
    "is its reply.",
)
routes.event(
    lambda s: s.host_cancel("{token}"),
    HostCancel,
    "An attempt the dispatcher gave up without its result (the run closed, the call moved, its "
    "heartbeats or its timeout ran out): its worker should stop it; the token is the one of the "
    "attempt's reply subject.",
)
routes.event(
    lambda s: s.workflows_start("{name}"),
    WorkflowStartRequest,
    "A workflow call, a request to whatever engine runs workflows; its reply is the call's output.",
)
routes.event(
    lambda s: s.internal_approval_requests,
    ApprovalNeeded,
    "dispatcher → approval: a call waits for a decision (JetStream, INTERNAL stream).",
)
routes.event(
    lambda s: s.internal_calls_park,
    CallParked,
    "dispatcher → credentials: a call met a 401 and waits for new credentials (JetStream).",
)
routes.event(
    lambda s: s.internal_runs_closed,
    RunClosed,
    "dispatcher → approval, credentials: a run ended (JetStream, INTERNAL stream).",
)
