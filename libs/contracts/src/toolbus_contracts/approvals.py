"""Approval bodies: the requested event, listing and deciding."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from toolbus_contracts.base import WireModel, null_as
from toolbus_contracts.names import ApprovalId, Namespace, RunId


class ApprovalRequested(WireModel):
    """Published on `events.approvals.requested` (and as the `approval.requested` webhook)."""

    approval_id: str
    call_id: str
    run_id: str
    namespace: str | None
    toolset_id: str
    tool: str
    input: dict[str, Any]
    requested_at: str

    def wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


APPROVALS_PAGE_MAX = 1000
"""The most approvals one `approvals.list` page holds (`limit`'s bound and default)."""


class ApprovalsListRequest(WireModel):
    run_id: RunId | None = None
    namespace: Namespace | None = None
    limit: Annotated[int, null_as(APPROVALS_PAGE_MAX)] = Field(
        default=APPROVALS_PAGE_MAX, ge=1, le=APPROVALS_PAGE_MAX
    )
    cursor: str | None = Field(default=None, max_length=400)


class ApprovalsListReply(WireModel):
    """One page, oldest request first; `next_cursor` where more are pending after it."""

    approvals: list[ApprovalRequested]
    next_cursor: str | None = None

    def wire(self) -> dict[str, Any]:
        page: dict[str, Any] = {"approvals": [a.wire() for a in self.approvals]}
        if self.next_cursor is not None:
            page["nextCursor"] = self.next_cursor
        return page


class ApprovalDecideRequest(WireModel):
    approval_id: ApprovalId
    approve: bool
    reason: str | None = Field(default=None, max_length=2000)


Decision = Literal["approved", "denied"]


class ApprovalDecideReply(WireModel):
    approval_id: str
    decision: Decision
