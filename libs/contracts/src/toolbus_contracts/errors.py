"""The error codes of the wire contract and the one exception hierarchy that carries them.

    ToolbusError(code, message, details, retryable)      root: every failure toolbus reports
     ├── InvalidRequest        invalidRequest       the body is malformed; names the field
     ├── NotFound              notFound
     ├── Conflict              conflict
     ├── UnknownTool           unknownTool
     ├── InvalidInput          invalidInput         the call input fails the pinned schema
     ├── HostNotAllowed        hostNotAllowed       the http tool's allow-list refused a host
     ├── UpstreamUnreachable   upstreamUnreachable  retryable: the request may never have left
     ├── UpstreamError         upstreamError
     ├── ToolError             toolError            the tool ran and reported an error
     ├── Timeout               timeout              retryable
     ├── OutcomeUnknown        outcomeUnknown
     ├── Denied                denied
     ├── Cancelled             cancelled
     ├── CredentialsRejected   credentialsRejected
     ├── OutputTooLarge        outputTooLarge       the tool's output is over TOOLBUS_MAX_OUTPUT_BYTES
     ├── Unavailable           unavailable          retryable: a backing store (Redis, JetStream)
     │                                              did not answer; nothing was changed
     └── Internal              internal             a bug in toolbus, and only that

`ToolbusError.to_wire()` gives the contract's error object and `ToolbusError.from_wire()` turns one
back into the same exception class, so an SDK raises what the service raised.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar


class ErrorCode(StrEnum):
    """Every error code a reply or a call outcome may carry."""

    INVALID_REQUEST = "invalidRequest"
    NOT_FOUND = "notFound"
    CONFLICT = "conflict"
    UNKNOWN_TOOL = "unknownTool"
    INVALID_INPUT = "invalidInput"
    HOST_NOT_ALLOWED = "hostNotAllowed"
    UPSTREAM_UNREACHABLE = "upstreamUnreachable"
    UPSTREAM_ERROR = "upstreamError"
    TOOL_ERROR = "toolError"
    TIMEOUT = "timeout"
    OUTCOME_UNKNOWN = "outcomeUnknown"
    DENIED = "denied"
    CANCELLED = "cancelled"
    CREDENTIALS_REJECTED = "credentialsRejected"
    OUTPUT_TOO_LARGE = "outputTooLarge"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


class ToolbusError(Exception):
    """A failure with a stable contract code; `retryable` says whether sending again can help."""

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL
    default_retryable: ClassVar[bool] = False

    def __init__(
        self, message: str, *, details: dict[str, Any] | None = None, retryable: bool | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}
        self.retryable = self.default_retryable if retryable is None else retryable

    def to_wire(self) -> dict[str, Any]:
        """The contract's error object: code, message and (when there are any) details."""
        wire: dict[str, Any] = {"code": self.code.value, "message": self.message}
        if self.details:
            wire["details"] = self.details
        return wire

    @staticmethod
    def from_wire(error: dict[str, Any]) -> ToolbusError:
        """Rebuild the exception a service raised from its wire error object."""
        try:
            cls = BY_CODE[ErrorCode(str(error.get("code")))]
        except ValueError:
            cls = Internal
        return cls(str(error.get("message", "")), details=error.get("details") or None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class InvalidRequest(ToolbusError):
    code = ErrorCode.INVALID_REQUEST


class NotFound(ToolbusError):
    code = ErrorCode.NOT_FOUND


class Conflict(ToolbusError):
    code = ErrorCode.CONFLICT


class UnknownTool(ToolbusError):
    code = ErrorCode.UNKNOWN_TOOL


class InvalidInput(ToolbusError):
    code = ErrorCode.INVALID_INPUT


class HostNotAllowed(ToolbusError):
    code = ErrorCode.HOST_NOT_ALLOWED


class UpstreamUnreachable(ToolbusError):
    code = ErrorCode.UPSTREAM_UNREACHABLE
    default_retryable = True


class UpstreamError(ToolbusError):
    code = ErrorCode.UPSTREAM_ERROR


class ToolError(ToolbusError):
    code = ErrorCode.TOOL_ERROR


class Timeout(ToolbusError):
    code = ErrorCode.TIMEOUT
    default_retryable = True


class OutcomeUnknown(ToolbusError):
    code = ErrorCode.OUTCOME_UNKNOWN


class Denied(ToolbusError):
    code = ErrorCode.DENIED


class Cancelled(ToolbusError):
    code = ErrorCode.CANCELLED


class CredentialsRejected(ToolbusError):
    code = ErrorCode.CREDENTIALS_REJECTED


class OutputTooLarge(ToolbusError):
    code = ErrorCode.OUTPUT_TOO_LARGE


class Unavailable(ToolbusError):
    code = ErrorCode.UNAVAILABLE
    default_retryable = True


class Internal(ToolbusError):
    code = ErrorCode.INTERNAL


BY_CODE: dict[ErrorCode, type[ToolbusError]] = {  # every code's exception class, for clients
    cls.code: cls
    for cls in (
        InvalidRequest,
        NotFound,
        Conflict,
        UnknownTool,
        InvalidInput,
        HostNotAllowed,
        UpstreamUnreachable,
        UpstreamError,
        ToolError,
        Timeout,
        OutcomeUnknown,
        Denied,
        Cancelled,
        CredentialsRejected,
        OutputTooLarge,
        Unavailable,
        Internal,
    )
}


def request_too_large(subject: str, size: int, limit: int) -> InvalidRequest:
    """The error for a request body over the NATS server's `max_payload` (nothing was sent), in the
    words every client of the bus uses."""
    return InvalidRequest(
        f"The request on {subject} is {size:,} bytes, over the {limit:,} bytes a NATS message may "
        "carry on this server (max_payload): send a smaller input.",
        details={"field": "body", "size": size, "maxPayload": limit},
    )
