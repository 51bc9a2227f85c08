"""The approval service's subjects: parse, call `Approvals`, reply (or ack). No logic here."""

from __future__ import annotations

from toolbus_common.bus import REQUEST_HEADERS, Routes
from toolbus_contracts.approvals import (
    ApprovalDecideReply,
    ApprovalDecideRequest,
    ApprovalRequested,
    ApprovalsHistoryReply,
    ApprovalsHistoryRequest,
    ApprovalsListReply,
    ApprovalsListRequest,
    RememberedListReply,
    RememberedListRequest,
    RememberedRevokeReply,
    RememberedRevokeRequest,
)
from toolbus_contracts.internal import ApprovalDecided, ApprovalNeeded, RunClosed

from toolbus_approval.approvals import Approvals, decode_cursor, encode_cursor

DURABLE_NEEDED = "approval-needed"
DURABLE_RUNS_CLOSED = "approval-runs-closed"

routes: Routes[Approvals] = Routes("approval")


@routes.request(lambda s: s.approvals_list)
async def handle_list(approvals: Approvals, request: ApprovalsListRequest) -> ApprovalsListReply:
    """Pending approvals, oldest first, filtered by run and/or namespace, a page at a time."""
    page, after = await approvals.pending(
        run_id=request.run_id,
        namespace=request.namespace,
        after=decode_cursor(request.cursor),
        limit=request.limit,
        budget=approvals.list_budget,
    )
    return ApprovalsListReply(approvals=page, next_cursor=encode_cursor(after) if after else None)


@routes.request(lambda s: s.approvals_decide)
async def handle_decide(approvals: Approvals, request: ApprovalDecideRequest) -> ApprovalDecideReply:
    """Decide a pending approval, optionally sending an edited input; a second decision is
    `conflict` (the first stands). The decider is who the request came in as (`identity`)."""
    decider = approvals.identity.decider(REQUEST_HEADERS.get({}), request.decider)
    return await approvals.decide(
        request.approval_id,
        approve=request.approve,
        reason=request.reason,
        edited_input=request.input,
        decider=decider,
        remember=request.remember,
    )


@routes.request(lambda s: s.approvals_remembered_list)
async def handle_remembered_list(approvals: Approvals, request: RememberedListRequest) -> RememberedListReply:
    """Remembered decisions in force, soonest to expire first, by namespace and/or tool."""
    found, truncated = await approvals.remembered_in_force(
        namespace=request.namespace, tool=request.tool, limit=request.limit
    )
    return RememberedListReply(remembered=found, truncated=truncated)


@routes.request(lambda s: s.approvals_remembered_revoke)
async def handle_remembered_revoke(
    approvals: Approvals, request: RememberedRevokeRequest
) -> RememberedRevokeReply:
    """Forget a remembered decision: later calls ask a person again."""
    await approvals.revoke(request.remembered_id)
    return RememberedRevokeReply(remembered_id=request.remembered_id, revoked=True)


@routes.request(lambda s: s.approvals_history)
async def handle_history(approvals: Approvals, request: ApprovalsHistoryRequest) -> ApprovalsHistoryReply:
    """Decisions, newest first, filtered by toolset, namespace, tool, decider, outcome and time."""
    page, before = await approvals.history(request)
    return ApprovalsHistoryReply(decisions=page, next_cursor=encode_cursor(before) if before else None)


@routes.command(lambda s: s.internal_approval_requests, durable=DURABLE_NEEDED)
async def handle_approval_needed(approvals: Approvals, needed: ApprovalNeeded) -> None:
    """dispatcher → approval: store and announce the approval (idempotent on approvalId)."""
    await approvals.request(needed)


@routes.command(lambda s: s.internal_runs_closed, durable=DURABLE_RUNS_CLOSED)
async def handle_run_closed(approvals: Approvals, closed: RunClosed) -> None:
    """dispatcher → approval: cancel the run's pending approvals."""
    await approvals.close_run(closed.run_id)


routes.event(
    lambda s: s.approvals_requested,
    ApprovalRequested,
    "A call waits for a decision (also sent as the webhook `approval.requested`).",
)
routes.event(
    lambda s: s.internal_approval_decisions,
    ApprovalDecided,
    "approval → dispatcher: a decision to apply (JetStream, INTERNAL stream).",
)
