"""toolbus for harness authors: a typed async client of the wire protocol, a host-tool worker,
agent tool definitions (`toolbus.agent`) and the `toolbus` CLI.

    from toolbus import Toolbus

    async with await Toolbus.connect() as tb:
        toolset = await tb.toolsets.create(mcp=[{"name": "github", "url": "https://..."}])
        async with await tb.runs.open(toolset, namespace="user-42") as run:
            issues = await run.call("github.list_issues", {"repo": "octo/cat"})

Every failure is a `ToolbusError` (code, message, details, retryable) of the class of its
contract code: `NotFound`, `InvalidInput`, `Denied`, `OutcomeUnknown`, ...
"""

from toolbus._approvals import Approvals
from toolbus._client import Toolbus
from toolbus._connection import ConnectOptions
from toolbus._connections import Connection
from toolbus._errors import (
    ERRORS,
    Cancelled,
    Conflict,
    CredentialsRejected,
    Denied,
    ErrorCode,
    HostNotAllowed,
    Internal,
    InvalidInput,
    InvalidRequest,
    NotFound,
    OutcomeUnknown,
    OutputTooLarge,
    Timeout,
    ToolbusError,
    ToolError,
    Unavailable,
    UnknownTool,
    UpstreamError,
    UpstreamUnreachable,
)
from toolbus._host_tools import CallContext, HostTool, host_tool
from toolbus._outcomes import CallResult
from toolbus._retry import Backoff
from toolbus._runs import CallHandle, CallStatus, Run, Runs
from toolbus._toolsets import Namespaces, Toolset, Toolsets, Workflows
from toolbus._worker import Worker

__all__ = [
    "ERRORS",
    "Approvals",
    "Backoff",
    "CallContext",
    "CallHandle",
    "CallResult",
    "CallStatus",
    "Cancelled",
    "Conflict",
    "ConnectOptions",
    "Connection",
    "CredentialsRejected",
    "Denied",
    "ErrorCode",
    "HostNotAllowed",
    "HostTool",
    "Internal",
    "InvalidInput",
    "InvalidRequest",
    "Namespaces",
    "NotFound",
    "OutcomeUnknown",
    "OutputTooLarge",
    "Run",
    "Runs",
    "Timeout",
    "ToolError",
    "Toolbus",
    "ToolbusError",
    "Toolset",
    "Toolsets",
    "Unavailable",
    "UnknownTool",
    "UpstreamError",
    "UpstreamUnreachable",
    "Worker",
    "Workflows",
    "host_tool",
]
