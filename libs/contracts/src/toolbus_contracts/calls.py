"""Runs, calls, outcomes, call events, host-tool messages and workflow starts."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from toolbus_contracts.base import Duration, WireModel, null_as
from toolbus_contracts.credentials import CredentialLevel
from toolbus_contracts.names import TOOL_NAME_MAX, CallId, IdempotencyKey, Namespace, RunId, ToolsetId

CallState = Literal["queued", "awaitingApproval", "waitingSlot", "running", "parked", "done"]
Id = str


class RunOpenRequest(WireModel):
    toolset_id: ToolsetId
    namespace: Namespace | None = None
    run_id: RunId | None = None


class RunOpenReply(WireModel):
    run_id: str


class RunCloseRequest(WireModel):
    run_id: RunId


class RunCloseReply(WireModel):
    run_id: str
    cancelled: int


class CallStartRequest(WireModel):
    """The body of `calls.start` and `calls.invoke`."""

    run_id: RunId
    tool: str = Field(min_length=1, max_length=TOOL_NAME_MAX)
    input: Annotated[dict[str, Any], null_as(dict)] = Field(default_factory=dict)
    idempotency_key: IdempotencyKey | None = None


class CallStartReply(WireModel):
    call_id: str
    idempotency_key: str


class OutcomeError(WireModel):
    code: str
    message: str


class Outcome(WireModel):
    """`{"status": "ok", "output": …}` or `{"status": "error", "error": {"code", "message"}}`."""

    status: Literal["ok", "error"]
    output: Any = None
    error: OutcomeError | None = None

    def wire(self) -> dict[str, Any]:
        if self.status == "ok":
            return {"status": "ok", "output": self.output}
        assert self.error is not None
        return {"status": "error", "error": self.error.wire()}

    @staticmethod
    def ok(output: Any) -> Outcome:
        return Outcome(status="ok", output=output)

    @staticmethod
    def failed(code: str, message: str) -> Outcome:
        return Outcome(status="error", error=OutcomeError(code=code, message=message))


class CallInvokeReply(WireModel):
    call_id: str
    idempotency_key: str
    outcome: dict[str, Any]


class CallGetRequest(WireModel):
    call_id: CallId


class CallGetReply(WireModel):
    call_id: str
    state: CallState
    attempts: int
    outcome: dict[str, Any] | None = None


CallEventType = Literal[
    "accepted",
    "approvalRequested",
    "approved",
    "denied",
    "attemptStarted",
    "parked",
    "resumed",
    "completed",
]


class CallEvent(WireModel):
    """One change of a call, on `events.calls.<runId>.<callId>`; extra fields by type."""

    type: CallEventType
    call_id: str
    run_id: str
    at: str
    attempt: int | None = None
    server: str | None = None
    level: CredentialLevel | None = None
    outcome: dict[str, Any] | None = None
    reason: str | None = None
    approval_id: str | None = None
    decider: str | None = None
    """Who decided (`approved`, `denied`): see `approvals.decide`."""
    input_digest: str | None = None
    """`approved` with an edited input: the digest of the input asked about..."""
    edited_input_digest: str | None = None
    """...and of the input sent instead."""


# ---- Host tools ---------------------------------------------------------------------------------


class HostCallTask(WireModel):
    """One attempt of a host-tool call, sent on `host.call.<tool>`."""

    call_id: str
    attempt: int
    idempotency_key: str
    run_id: str
    namespace: str | None
    toolset_id: str
    tool: str
    input: dict[str, Any]
    heartbeat_timeout: str
    timeout: Duration | None = None
    """The tool's `timeout` (absent: none): past it the dispatcher has given the attempt up, so a
    worker stops running it."""

    def wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_task(cls, body: Any) -> HostCallTask:
        """Parse a task as a worker does: fields a newer dispatcher adds are ignored (so a worker
        keeps serving across an upgrade), every known one is checked."""
        if isinstance(body, dict):
            body = {k: v for k, v in body.items() if k in _HOST_TASK_KEYS}
        return cls.model_validate(body)


_HOST_TASK_KEYS = frozenset(
    {f.alias or name for name, f in HostCallTask.model_fields.items()} | set(HostCallTask.model_fields)
)
"""The keys a HostCallTask knows, by wire name and by field name."""


class HostResultError(WireModel):
    message: str


class HostResult(WireModel):
    """A worker's result on `host.result.<callId>.<token>`: output or error, for one attempt."""

    attempt: int
    output: Any = None
    error: HostResultError | None = None


class HostCancel(WireModel):
    """Body of `host.cancel.<token>`: the attempt the dispatcher gave up (the run was
    closed, the call moved or timed out, its heartbeats stopped); its result would be dropped."""

    attempt: int


class HostHeartbeat(WireModel):
    """Body of `host.heartbeat.<callId>.<token>`: the attempt the worker runs, or empty. On the bare
    `host.heartbeat.<callId>` only the attempt counts (answers anyone can have sent there carry none)."""

    attempt: int | None = None


# ---- http tool and workflows --------------------------------------------------------------------


class HttpFetchInput(WireModel):
    url: str
    method: str = "GET"
    headers: dict[str, str] = Field(default_factory=dict)
    body: str | None = None


class HttpFetchOutput(WireModel):
    status: int
    headers: dict[str, str]
    body: str
    body_encoding: Literal["text", "base64"]


class WorkflowStartRequest(WireModel):
    """Sent on `workflows.start.<name>` to whatever engine runs workflows; its reply is the output."""

    name: str
    version: str
    input: dict[str, Any]
    parent_run_id: str
    call_id: str
    idempotency_key: str
