"""The one place where what an MCP exchange saw becomes a contract exception.

    what happened                                   raised                     retryable  details.sent
    connection refused / DNS, before sending        UpstreamUnreachable        yes        False
    connection broke after sending, no answer       UpstreamUnreachable        yes        True
    no answer within the timeout                    Timeout                    yes        True
    HTTP 401 / 403                                  CredentialsRejected        no         True
                                                    (403 insufficient_scope: details.insufficientScope,
                                                    and requiredScopes: the scopes it asks for)
    HTTP 502 / 503 / 504                            UpstreamError              yes        True
    other HTTP 4xx / 5xx, JSON-RPC or protocol      UpstreamError              no         True
                                                    (details: status and/or rpcCode)

Every exception's `details` holds `server` (the server's name in the toolset), never a header
value or the URL (which may carry a token), and its message names the server.
"""

from __future__ import annotations

from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT
from toolbus_contracts.errors import (
    CredentialsRejected,
    Timeout,
    ToolbusError,
    UpstreamError,
    UpstreamUnreachable,
)

from toolbus_mcp_client._transport import NO_ANSWER_STATUS, Attempt

RETRYABLE_STATUSES = frozenset({502, 503, 504})
REJECTING_STATUSES = frozenset({401, 403})


def _clip(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def classify(
    server: str, attempt: Attempt, error: MCPError | None, *, what: str, timeout: float | None = None
) -> ToolbusError:
    """Turn what `attempt` recorded (and the SDK's error, if any) into the contract exception.

    `what` names the operation for the message, e.g. "the call of tool 'echo'".
    """
    status = attempt.status if attempt.status != NO_ANSWER_STATUS else None
    if status in REJECTING_STATUSES:
        details: dict[str, object] = {"server": server, "status": status}
        if attempt.insufficient_scope:
            details["insufficientScope"] = True
            if attempt.required_scopes:
                details["requiredScopes"] = list(attempt.required_scopes)
        return CredentialsRejected(
            f"MCP server '{server}' rejected the credentials (HTTP {status}) for {what}; "
            f"set valid credentials for '{server}' and try again.",
            details=details,
        )
    if attempt.failed_before_sending:
        return UpstreamUnreachable(
            f"Could not connect to MCP server '{server}' ({attempt.network_error}); "
            "check that it is running and that its URL is right.",
            details={"server": server, "sent": False},
            retryable=True,
        )
    if error is not None and error.code == REQUEST_TIMEOUT:
        limit = f" within {timeout:g}s" if timeout is not None else " in time"
        return Timeout(
            f"MCP server '{server}' did not answer {what}{limit}; it may still be working on it.",
            details={"server": server, "sent": True, "timeout": timeout},
            retryable=True,
        )
    if attempt.network_error is not None:
        return UpstreamUnreachable(
            f"The connection to MCP server '{server}' broke before it answered {what} "
            f"({attempt.network_error}); the request may have reached it.",
            details={"server": server, "sent": True},
            retryable=True,
        )
    if status is not None and status in RETRYABLE_STATUSES:
        return UpstreamError(
            f"MCP server '{server}' is temporarily unavailable (HTTP {status}) for {what}; try again later.",
            details={"server": server, "status": status, "sent": True},
            retryable=True,
        )
    if status is not None and status >= 400 and error is not None and attempt.status_has_json:
        return UpstreamError(
            f"MCP server '{server}' refused {what}: {_clip(error.message)} (JSON-RPC error {error.code}).",
            details={"server": server, "status": status, "rpcCode": error.code, "sent": True},
            retryable=False,
        )
    if status is not None and status >= 400:
        reason = f": {_clip(error.message)}" if error is not None and error.message else ""
        return UpstreamError(
            f"MCP server '{server}' answered HTTP {status} to {what}{reason}; check the server and its URL.",
            details={"server": server, "status": status, "sent": True},
            retryable=False,
        )
    if error is not None and error.code == CONNECTION_CLOSED:
        return UpstreamUnreachable(
            f"The connection to MCP server '{server}' closed before it answered {what}; "
            "the request may have reached it.",
            details={"server": server, "sent": True},
            retryable=True,
        )
    if error is not None:
        return UpstreamError(
            f"MCP server '{server}' refused {what}: {_clip(error.message)} (JSON-RPC error {error.code}).",
            details={"server": server, "rpcCode": error.code, "sent": True},
            retryable=False,
        )
    return UpstreamError(
        f"MCP server '{server}' failed {what} without a usable answer; check the server's logs.",
        details={"server": server, "sent": attempt.sent},
        retryable=False,
    )


def protocol_error(server: str, what: str, problem: str) -> UpstreamError:
    """An answer that arrived but breaks the MCP protocol (bad shape, endless paging...)."""
    return UpstreamError(
        f"MCP server '{server}' sent an invalid answer to {what}: {_clip(problem)}.",
        details={"server": server, "sent": True},
        retryable=False,
    )
