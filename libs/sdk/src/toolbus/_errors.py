"""The SDK's exceptions: the contract's own hierarchy (`toolbus_contracts.errors`), not a second one.

    ToolbusError(code, message, details, retryable)    root: every failure toolbus reports
     ├── InvalidRequest, NotFound, Conflict, UnknownTool, InvalidInput, HostNotAllowed,
     ├── UpstreamUnreachable (retryable), UpstreamError, ToolError, Timeout (retryable),
     ├── OutcomeUnknown, Denied, Cancelled, CredentialsRejected, OutputTooLarge,
     ├── Unavailable (retryable): a backing store, or no service at all, answered
     └── Internal: a bug in toolbus

A reply `{"ok": false, "error": ...}` and a call outcome `{"status": "error", ...}` both become the
exception class of their code (`ToolbusError.from_wire`); a failed call's exception carries its
`callId` in `details`. Two conditions the SDK sees itself map onto the same codes: no service
subscribed to a subject is `Unavailable` (retryable: start the stack), and no reply within the
request's timeout is `Timeout`; a request, subscription, feed or output fetch on a client that
was closed (or a wait under way when it is closed) is `Unavailable` with `details.closed` (not
retryable). A retryable `Unavailable` is sent again until the request's timeout
is spent (`toolbus._retry`) before it reaches the caller.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from nats.errors import ConnectionClosedError, ConnectionDrainingError
from toolbus_contracts.errors import (
    BY_CODE,
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

ERRORS: dict[ErrorCode, type[ToolbusError]] = BY_CODE
"""Every contract code's exception class (the contracts' own table)."""


def error_from_wire(error: Any, **extra: Any) -> ToolbusError:
    """The exception of a wire error object (unknown codes are `Internal`); `extra` joins details."""
    if not isinstance(error, dict):
        return Internal(f"toolbus answered an error that is not an object: {str(error)[:200]}")
    exc = ToolbusError.from_wire(error)
    if extra:
        exc.details = {**exc.details, **extra}
    return exc


def client_closed(subject: str) -> Unavailable:
    """What the SDK raises for anything done on a client that was closed (or is draining): a
    request, a subscription, an event feed, an output fetch. Not retryable."""
    return Unavailable(
        "This Toolbus client is closed: connect again with Toolbus.connect().",
        details={"subject": subject, "closed": True},
        retryable=False,
    )


@contextlib.contextmanager
def closed_as_unavailable(subject: str) -> Iterator[None]:
    """nats-py's errors for a closed or draining client as `client_closed(subject)`."""
    try:
        yield
    except (ConnectionClosedError, ConnectionDrainingError):
        raise client_closed(subject) from None


__all__ = [
    "ERRORS",
    "Cancelled",
    "Conflict",
    "CredentialsRejected",
    "Denied",
    "ErrorCode",
    "HostNotAllowed",
    "Internal",
    "InvalidInput",
    "InvalidRequest",
    "NotFound",
    "OutcomeUnknown",
    "OutputTooLarge",
    "Timeout",
    "ToolError",
    "ToolbusError",
    "Unavailable",
    "UnknownTool",
    "UpstreamError",
    "UpstreamUnreachable",
    "error_from_wire",
]
