"""The approval service's subscribers: parse, call `Approvals`, reply (or ack). No logic here."""

from __future__ import annotations

from toolbus_common.rpc import RpcServer
from toolbus_contracts import Subjects, ToolbusError, parse_body
from toolbus_contracts.approvals import (
    ApprovalDecideReply,
    ApprovalDecideRequest,
    ApprovalsListReply,
    ApprovalsListRequest,
)
from toolbus_contracts.internal import ApprovalNeeded, RunClosed

from toolbus_approval.approvals import Approvals
from toolbus_approval.consumer import MessageHandler, PoisonMessage


def add_routes(rpc: RpcServer, subjects: Subjects, approvals: Approvals) -> None:
    """`approvals.list` and `approvals.decide`."""

    async def handle_list(request: ApprovalsListRequest) -> ApprovalsListReply:
        pending = await approvals.pending(run_id=request.run_id, namespace=request.namespace)
        return ApprovalsListReply(approvals=pending)

    async def handle_decide(request: ApprovalDecideRequest) -> ApprovalDecideReply:
        return await approvals.decide(request.approval_id, approve=request.approve, reason=request.reason)

    rpc.route(subjects.approvals_list, ApprovalsListRequest, handle_list)
    rpc.route(subjects.approvals_decide, ApprovalDecideRequest, handle_decide)


def approval_needed_handler(approvals: Approvals) -> MessageHandler:
    """`internal.approvals.needed`: store and announce the approval (idempotent)."""

    async def handle_approval_needed(data: bytes) -> None:
        try:
            needed = parse_body(ApprovalNeeded, data)
        except ToolbusError as exc:
            raise PoisonMessage(f"ApprovalNeeded: {exc.message}") from None
        await approvals.request(needed)

    return handle_approval_needed


def run_closed_handler(approvals: Approvals) -> MessageHandler:
    """`internal.runs.closed`: cancel the run's pending approvals."""

    async def handle_run_closed(data: bytes) -> None:
        try:
            closed = parse_body(RunClosed, data)
        except ToolbusError as exc:
            raise PoisonMessage(f"RunClosed: {exc.message}") from None
        await approvals.close_run(closed.run_id)

    return handle_run_closed
