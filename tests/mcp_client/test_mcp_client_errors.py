"""What an MCP exchange saw maps to exactly one contract exception (`toolbus_mcp_client._errors`)."""

from __future__ import annotations

import pytest
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INTERNAL_ERROR, INVALID_PARAMS, REQUEST_TIMEOUT
from toolbus_contracts.errors import (
    CredentialsRejected,
    ErrorCode,
    Timeout,
    ToolbusError,
    UpstreamError,
    UpstreamUnreachable,
)
from toolbus_mcp_client._errors import classify, protocol_error
from toolbus_mcp_client._transport import NO_ANSWER_STATUS, Attempt

STAND_IN = MCPError(INTERNAL_ERROR, "Server returned an error response")


def _check(error: ToolbusError, cls: type[ToolbusError], retryable: bool) -> None:
    assert type(error) is cls
    assert error.retryable is retryable
    assert error.details["server"] == "gh"
    assert "'gh'" in error.message
    assert error.message.endswith(".")


def test_refused_before_sending() -> None:
    attempt = Attempt(sent=False, status=NO_ANSWER_STATUS, network_error="[Errno 111] Connection refused")
    error = classify("gh", attempt, STAND_IN, what="the call of tool 'x'")
    _check(error, UpstreamUnreachable, True)
    assert error.details == {"server": "gh", "sent": False}
    assert "Connection refused" in error.message


def test_broken_after_sending() -> None:
    attempt = Attempt(sent=True, status=NO_ANSWER_STATUS, network_error="Server disconnected")
    error = classify("gh", attempt, STAND_IN, what="the call of tool 'x'")
    _check(error, UpstreamUnreachable, True)
    assert error.details == {"server": "gh", "sent": True}


def test_body_broken_off_after_headers() -> None:
    attempt = Attempt(sent=True, status=200, network_error="peer closed connection")
    error = classify("gh", attempt, MCPError(CONNECTION_CLOSED, "SSE stream ended"), what="x")
    _check(error, UpstreamUnreachable, True)
    assert error.details["sent"] is True


def test_connection_closed_without_network_error() -> None:
    error = classify("gh", Attempt(sent=True, status=200), MCPError(CONNECTION_CLOSED, "closed"), what="x")
    _check(error, UpstreamUnreachable, True)
    assert error.details["sent"] is True


def test_timeout() -> None:
    error = classify(
        "gh", Attempt(sent=True), MCPError(REQUEST_TIMEOUT, "timed out"), what="the call", timeout=2.5
    )
    _check(error, Timeout, True)
    assert error.details == {"server": "gh", "sent": True, "timeout": 2.5}
    assert "2.5s" in error.message


@pytest.mark.parametrize("status", [401, 403])
def test_rejected_credentials(status: int) -> None:
    error = classify("gh", Attempt(sent=True, status=status), STAND_IN, what="x")
    _check(error, CredentialsRejected, False)
    assert error.code is ErrorCode.CREDENTIALS_REJECTED
    assert error.details == {"server": "gh", "status": status}


@pytest.mark.parametrize("status", [502, 503, 504])
def test_gateway_statuses_are_retryable(status: int) -> None:
    error = classify("gh", Attempt(sent=True, status=status), STAND_IN, what="x")
    _check(error, UpstreamError, True)
    assert error.details == {"server": "gh", "status": status, "sent": True}


@pytest.mark.parametrize("status", [400, 404, 409, 500, 501])
def test_other_statuses_are_final(status: int) -> None:
    error = classify("gh", Attempt(sent=True, status=status), STAND_IN, what="x")
    _check(error, UpstreamError, False)
    assert error.details["status"] == status


def test_json_rpc_error_in_an_error_status_names_its_code() -> None:
    attempt = Attempt(sent=True, status=400, status_has_json=True)
    error = classify("gh", attempt, MCPError(INVALID_PARAMS, "Unknown tool: x"), what="the call of tool 'x'")
    _check(error, UpstreamError, False)
    assert error.details == {"server": "gh", "status": 400, "rpcCode": INVALID_PARAMS, "sent": True}
    assert "Unknown tool: x" in error.message


def test_json_rpc_error_on_200() -> None:
    error = classify("gh", Attempt(sent=True, status=200), MCPError(INVALID_PARAMS, "bad"), what="x")
    _check(error, UpstreamError, False)
    assert error.details["rpcCode"] == INVALID_PARAMS


def test_long_server_messages_are_clipped() -> None:
    error = classify("gh", Attempt(sent=True, status=200), MCPError(INVALID_PARAMS, "x" * 5000), what="x")
    assert len(error.message) < 400


def test_protocol_error() -> None:
    error = protocol_error("gh", "listing tools", "it repeated a page cursor")
    _check(error, UpstreamError, False)


def test_wire_form_round_trips_through_the_contract() -> None:
    error = classify("gh", Attempt(sent=True, status=503), STAND_IN, what="x")
    back = ToolbusError.from_wire(error.to_wire())
    assert type(back) is UpstreamError
    assert back.details == error.details


def test_a_403_asking_for_a_larger_scope_is_marked_for_step_up() -> None:
    plain = classify("gh", Attempt(sent=True, status=403), None, what="the call")
    assert isinstance(plain, CredentialsRejected) and "insufficientScope" not in plain.details
    step_up = classify("gh", Attempt(sent=True, status=403, insufficient_scope=True), None, what="the call")
    assert isinstance(step_up, CredentialsRejected)
    assert step_up.details == {"server": "gh", "status": 403, "insufficientScope": True}


def _challenge(header: str) -> tuple[bool, tuple[str, ...]]:
    attempt = Attempt(sent=True, status=403)
    attempt.read_challenge(header)
    return attempt.insufficient_scope, attempt.required_scopes


def test_a_step_up_challenge_gives_the_scopes_it_asks_for() -> None:
    header = 'Bearer error="insufficient_scope", scope="repo  read:org repo", resource_metadata="x"'
    assert _challenge(header) == (True, ("repo", "read:org"))
    attempt = Attempt(sent=True, status=403)
    attempt.read_challenge(header)
    assert classify("gh", attempt, None, what="the call").details["requiredScopes"] == ["repo", "read:org"]
    # No scope named; malformed scope tokens dropped; another error is no step-up.
    assert _challenge('Bearer error="insufficient_scope"') == (True, ())
    assert _challenge('Bearer error="insufficient_scope", scope="ok \\bad"') == (True, ("ok",))
    assert _challenge('Bearer error="invalid_token", scope="repo"') == (False, ())
