"""The approval service's pure parts: what a stored approval turns into on the wire, the conflict
messages, the webhook id, and the settings."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError
from toolbus_approval.approvals import _conflict_details, _conflict_message
from toolbus_approval.settings import ApprovalSettings
from toolbus_approval.store import DecideResult, StoredApproval, epoch_ms, webhook_id
from toolbus_contracts.internal import ApprovalNeeded

NEEDED = ApprovalNeeded(
    approval_id="apr_1",
    call_id="call_1",
    run_id="run_1",
    namespace=None,
    toolset_id="ts_1",
    tool="stripe.create_refund",
    input={"amount": 5},
    input_digest="d" * 64,
    requested_at="2026-11-30T08:00:00.000Z",
)


def test_requested_event_has_the_contract_fields_and_no_digest() -> None:
    event = StoredApproval(NEEDED, "pending", None, None).requested().wire()
    assert event == {
        "approvalId": "apr_1",
        "callId": "call_1",
        "runId": "run_1",
        "namespace": None,
        "toolsetId": "ts_1",
        "tool": "stripe.create_refund",
        "input": {"amount": 5},
        "requestedAt": "2026-11-30T08:00:00.000Z",
    }


def test_decision_is_bound_to_what_was_asked() -> None:
    decided = StoredApproval(NEEDED, "denied", "too much", "2026-11-30T08:01:00.000Z").decided()
    assert decided.wire() == {
        "approvalId": "apr_1",
        "callId": "call_1",
        "runId": "run_1",
        "toolsetId": "ts_1",
        "tool": "stripe.create_refund",
        "inputDigest": "d" * 64,
        "decision": "denied",
        "reason": "too much",
    }


@pytest.mark.parametrize("state", ["pending", "cancelled"])
def test_only_decided_approvals_make_a_decision(state: str) -> None:
    with pytest.raises(ValueError, match=state):
        StoredApproval(NEEDED, state, None, None).decided()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("result", "says"),
    [
        (DecideResult("taken", "approved"), "already approved; the first decision stands"),
        (DecideResult("taken", "denied", "no"), "already denied; the first decision stands"),
        (DecideResult("taken", "denied", "expired"), "already expired and was denied"),
        (DecideResult("taken", "cancelled", "run closed"), "cancelled because its run closed"),
    ],
)
def test_conflict_says_what_came_first(result: DecideResult, says: str) -> None:
    assert says in _conflict_message("apr_1", result)
    assert _conflict_details(result)["state"] == result.state


def test_webhook_id_is_one_per_approval() -> None:
    assert webhook_id("apr_1") == webhook_id("apr_1") == "msg_approval_requested_apr_1"
    assert webhook_id("apr_2") != webhook_id("apr_1")


def test_epoch_ms_reads_rfc3339_with_z_offset_or_naive_utc() -> None:
    assert epoch_ms("1970-01-01T00:00:01.500Z") == 1500
    assert epoch_ms("1970-01-01T01:00:01.500+01:00") == 1500
    assert epoch_ms("1970-01-01T00:00:01.500") == 1500


def test_timeout_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOOLBUS_APPROVAL_TIMEOUT", raising=False)
    assert ApprovalSettings().timeout is None
    monkeypatch.setenv("TOOLBUS_APPROVAL_TIMEOUT", "1h30m")
    assert ApprovalSettings().timeout == timedelta(hours=1, minutes=30)
    for bad in ("0s", "-5m", "soon"):
        monkeypatch.setenv("TOOLBUS_APPROVAL_TIMEOUT", bad)
        with pytest.raises(ValidationError):
            ApprovalSettings()


@pytest.mark.parametrize("settings_of", ["approval", "credentials"])
def test_both_webhook_senders_read_the_webhook_settings(
    monkeypatch: pytest.MonkeyPatch, settings_of: str
) -> None:
    """`TOOLBUS_WEBHOOK_TIMEOUT` and `TOOLBUS_WEBHOOK_RETRY_SCHEDULE` mean the same in both services
    that send webhooks (the approval service used a fixed 10 s per attempt before)."""
    from toolbus_credentials.settings import CredentialsSettings

    cls = ApprovalSettings if settings_of == "approval" else CredentialsSettings
    monkeypatch.delenv("TOOLBUS_WEBHOOK_TIMEOUT", raising=False)
    monkeypatch.delenv("TOOLBUS_WEBHOOK_RETRY_SCHEDULE", raising=False)
    assert cls().webhook_timeout_seconds == 10.0
    monkeypatch.setenv("TOOLBUS_WEBHOOK_TIMEOUT", "2500ms")
    monkeypatch.setenv("TOOLBUS_WEBHOOK_RETRY_SCHEDULE", "1s,5s")
    assert cls().webhook_timeout_seconds == 2.5
    assert cls().webhook_retry_schedule == "1s,5s"
    for name, bad in (("TOOLBUS_WEBHOOK_TIMEOUT", "0s"), ("TOOLBUS_WEBHOOK_RETRY_SCHEDULE", "soon")):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValidationError):
            cls()
        monkeypatch.delenv(name)
