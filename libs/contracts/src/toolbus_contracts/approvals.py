"""Approval bodies: the requested event, listing and deciding."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from toolbus_contracts.base import Duration, WireModel, null_as
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
    rule_error: str | None = None
    """Set when the tool's approval rule could not be evaluated: why this call asks."""
    expires_at: str | None = None

    def wire(self) -> dict[str, Any]:
        body = self.model_dump(mode="json")
        for optional in ("ruleError", "expiresAt"):
            if body[optional] is None:
                del body[optional]
        return body


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


REMEMBER_MAX_SECONDS = 90 * 24 * 3600
"""The longest a decision may be remembered (`remember.for`)."""


class Remember(WireModel):
    """Decide later calls of the same namespace and tool (with `same_input`, only those with the
    same input) the same way, at once, for `for_` (a duration, at most 90 days)."""

    for_: Duration = Field(alias="for")
    same_input: bool = False


class ApprovalDecideRequest(WireModel):
    approval_id: ApprovalId
    approve: bool
    reason: str | None = Field(default=None, max_length=2000)
    input: dict[str, Any] | None = None
    """With `approve`: the input to send instead of the one asked about (edit, then approve),
    checked against the tool's input schema."""
    remember: Remember | None = None
    decider: str | None = Field(default=None, min_length=1, max_length=200)
    """Who decides, in the client's own words: recorded as `claimed:<decider>`, and only where
    the server vouches for no identity (see `approvals.decide` in docs/protocol.md)."""


Decision = Literal["approved", "denied"]


class ApprovalDecideReply(WireModel):
    approval_id: str
    decision: Decision
    edited_input_digest: str | None = None
    remembered_id: str | None = None


HISTORY_PAGE_MAX = 500
"""The most decisions one `approvals.history` page holds (`limit`'s bound and default)."""


class ApprovalsHistoryRequest(WireModel):
    """Decisions, newest first, filtered; each filter optional. `since`/`until`: RFC 3339 times
    bounding `decidedAt` (`since` inclusive, `until` exclusive)."""

    toolset_id: str | None = Field(default=None, max_length=200)
    namespace: Namespace | None = None
    tool: str | None = Field(default=None, max_length=300)
    decider: str | None = Field(default=None, max_length=300)
    outcome: Decision | None = None
    since: str | None = Field(default=None, max_length=64)
    until: str | None = Field(default=None, max_length=64)
    limit: Annotated[int, null_as(100)] = Field(default=100, ge=1, le=HISTORY_PAGE_MAX)
    cursor: str | None = Field(default=None, max_length=400)


class ApprovalRecord(WireModel):
    """One decision as `approvals.history` shows it (the input is not repeated: its digests are)."""

    approval_id: str
    call_id: str
    run_id: str
    namespace: str | None = None
    toolset_id: str
    tool: str
    decision: Decision
    reason: str | None = None
    decider: str | None = None
    requested_at: str
    decided_at: str
    input_digest: str
    edited_input_digest: str | None = None


class ApprovalsHistoryReply(WireModel):
    """One page, newest decision first; `next_cursor` where the search goes on (a page may hold
    fewer than `limit`, even none, when few decisions match among those scanned)."""

    decisions: list[ApprovalRecord]
    next_cursor: str | None = None


class RememberedDecision(WireModel):
    """A decision remembered for later calls of `namespace` and `tool` (of one input when
    `input_digest` is set) until `expires_at`."""

    remembered_id: str
    namespace: str | None = None
    tool: str
    input_digest: str | None = None
    decision: Decision
    reason: str | None = None
    decider: str
    approval_id: str
    """The approval whose decision this remembers."""
    created_at: str
    expires_at: str


REMEMBERED_PAGE_MAX = 1000


class RememberedListRequest(WireModel):
    namespace: Namespace | None = None
    tool: str | None = Field(default=None, max_length=300)
    limit: Annotated[int, null_as(REMEMBERED_PAGE_MAX)] = Field(
        default=REMEMBERED_PAGE_MAX, ge=1, le=REMEMBERED_PAGE_MAX
    )


class RememberedListReply(WireModel):
    """Remembered decisions in force, soonest to expire first; `truncated` when more match."""

    remembered: list[RememberedDecision]
    truncated: bool = False


class RememberedRevokeRequest(WireModel):
    remembered_id: str = Field(min_length=1, max_length=100)


class RememberedRevokeReply(WireModel):
    remembered_id: str
    revoked: bool
