"""Webhook settings parsing and Standard Webhooks signing, without a network."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook
from toolbus_common.keys import Keys
from toolbus_common.webhooks import WebhookSender, parse_schedule, signer


def test_schedule_parses_durations_in_order() -> None:
    assert parse_schedule("5s,30s,2m,10m,1h") == (5.0, 30.0, 120.0, 600.0, 3600.0)
    assert parse_schedule(" 500ms , 1h30m ") == (0.5, 5400.0)


@pytest.mark.parametrize("text", ["", "5s,,nope", "0s", "-1s"])
def test_bad_schedule_is_a_clear_error(text: str) -> None:
    with pytest.raises(ValueError, match="TOOLBUS_WEBHOOK_RETRY_SCHEDULE"):
        parse_schedule(text)


def test_whsec_secret_signs_as_standard_webhooks_verifies() -> None:
    secret = "whsec_" + base64.b64encode(b"k" * 24).decode()
    now = datetime.now(UTC)
    body = '{"type":"credentials.expired","data":{}}'
    signature = signer(secret).sign("msg_1", now, body)
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
    }
    assert Webhook(secret).verify(body, headers) == {"type": "credentials.expired", "data": {}}


def test_raw_secret_is_used_as_its_utf8_bytes() -> None:
    now = datetime.now(UTC)
    signature = signer("plain-shared-secret").sign("msg_2", now, "{}")
    headers = {
        "webhook-id": "msg_2",
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
    }
    assert Webhook(b"plain-shared-secret").verify("{}", headers) == {}


def test_a_url_without_a_secret_is_a_start_up_error() -> None:
    from redis.asyncio import Redis

    with pytest.raises(ValueError, match="TOOLBUS_WEBHOOK_SECRET is required"):
        WebhookSender(Redis(), Keys("x"), url="http://127.0.0.1:1/hook", secret=None)
