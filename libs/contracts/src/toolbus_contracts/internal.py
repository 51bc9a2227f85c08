"""Service-to-service commands. They travel on `‹p›.internal.*`, which the INTERNAL JetStream
stream keeps, so a command sent while its consumer is down is applied when it is back."""

from __future__ import annotations

from typing import Any

from toolbus_contracts.approvals import Decision
from toolbus_contracts.base import WireModel
from toolbus_contracts.credentials import CredentialLevel


class ApprovalNeeded(WireModel):
    """dispatcher → approval: the call waits for a decision. `input_digest` binds the decision to
    the exact input (sha256 hex of its canonical JSON)."""

    approval_id: str
    call_id: str
    run_id: str
    namespace: str | None = None
    toolset_id: str
    tool: str
    input: dict[str, Any]
    input_digest: str
    requested_at: str
    timeout: str | None = None
    """The tool's `approvalTimeout` (a duration), when its policy sets one."""
    rule_error: str | None = None
    """Why the tool's approval rule could not be evaluated, when that is why this call asks."""


class ApprovalDecided(WireModel):
    """approval → dispatcher: a decision; the dispatcher applies it only if tool, toolset and digest
    still match the call."""

    approval_id: str
    call_id: str
    run_id: str
    toolset_id: str
    tool: str
    input_digest: str
    decision: Decision
    reason: str | None = None
    input: dict[str, Any] | None = None
    """An edited input to send instead (approved only); `edited_input_digest` is its digest."""
    edited_input_digest: str | None = None
    decider: str | None = None
    """Who decided (see `approvals.decide`); `expired` decisions have none."""


class CallParked(WireModel):
    """dispatcher → credentials: the call got a 401 (or a 403 `insufficient_scope`) from
    `server` using credentials of `level` (scope: the toolset, namespace or run they came from)
    and waits for new ones there."""

    call_id: str
    run_id: str
    toolset_id: str
    namespace: str | None = None
    server: str
    level: CredentialLevel
    parked_at: str
    credentials_version: int | None = None
    """The credentials version counter the failing attempt resolved its headers at (at least as
    new as the headers sent). The credentials service resumes the call at once, instead of holding
    it, when a set at its level and scope gave a higher version. Absent (older dispatchers): held."""
    required_scopes: list[str] | None = None
    """Set when the server answered 403 `insufficient_scope` (step-up): the scopes its
    `WWW-Authenticate` challenge asked for (maybe none). Absent for a 401."""


class CallsResume(WireModel):
    """credentials → dispatcher: send these parked calls again, in this order, same keys. An empty
    `reason` resumes; `reason="credentialsRejected"` ends them (parked too long)."""

    call_ids: list[str]
    reason: str | None = None


class CredentialsChanged(WireModel):
    """credentials → dispatchers: cached credentials of this scope are stale."""

    level: CredentialLevel
    toolset_id: str | None = None
    namespace: str | None = None
    run_id: str | None = None


class RunClosed(WireModel):
    """dispatcher → approval, credentials: the run ended; drop its pending state."""

    run_id: str
    toolset_id: str
    call_ids: list[str]
