"""`WebhookSender` against real Redis and a real HTTP receiver: signed bodies, retries with the
same webhook-id, deliveries that survive a restart, one sender per attempt across replicas."""

from __future__ import annotations

import base64
import secrets
from typing import Any

import pytest
from standardwebhooks import Webhook
from toolbus_common.keys import Keys
from toolbus_common.webhooks import WebhookSender

from tests.support.infra import until
from tests.support.webhooks import webhook_receiver as receiver

pytestmark = pytest.mark.integration

SECRET = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def sender(redis_client: Any, keys: Keys, url: str, **kwargs: Any) -> WebhookSender:
    kwargs.setdefault("schedule", "20ms,20ms,20ms")
    kwargs.setdefault("poll_interval", 0.02)
    kwargs.setdefault("timeout", 2.0)
    return WebhookSender(redis_client, keys, url=url, secret=SECRET, **kwargs)


@pytest.fixture
def keys(redis_prefix: str) -> Keys:
    return Keys(f"{redis_prefix}:wh{secrets.token_hex(3)}")


async def test_delivery_is_signed_as_standard_webhooks(redis_client: Any, keys: Keys) -> None:
    async with receiver() as rec:
        s = sender(redis_client, keys, rec.url)
        await s.start()
        try:
            webhook_id = await s.enqueue("credentials.expired", {"server": "github", "callIds": ["c1"]})
            await until(lambda: len(rec.received) == 1, "one delivery")
        finally:
            await s.stop()
    headers, body = rec.received[0]
    assert headers["webhook-id"] == webhook_id
    assert Webhook(SECRET).verify(body, headers) == {
        "type": "credentials.expired",
        "data": {"server": "github", "callIds": ["c1"]},
    }
    assert await s.pending() == 0


async def test_failures_and_timeouts_are_retried_with_the_same_webhook_id(
    redis_client: Any, keys: Keys
) -> None:
    async with receiver() as rec:
        rec.statuses = [500, 503]
        s = sender(redis_client, keys, rec.url)
        await s.start()
        try:
            webhook_id = await s.enqueue("approval.requested", {"approvalId": "a1"})
            await until(lambda: len(rec.received) == 3, "two failures then a success")
            await until(lambda: _zero(s), "delivery removed after success")
        finally:
            await s.stop()
    ids = [h["webhook-id"] for h, _ in rec.received]
    assert ids == [webhook_id] * 3
    for headers, body in rec.received:
        Webhook(SECRET).verify(body, headers)


async def _zero(s: WebhookSender) -> bool:
    return await s.pending() == 0


async def test_a_slow_receiver_counts_as_a_failure_and_is_retried(redis_client: Any, keys: Keys) -> None:
    async with receiver() as rec:
        rec.delay = 0.5
        s = sender(redis_client, keys, rec.url, timeout=0.1)
        await s.start()
        try:
            await s.enqueue("credentials.expired", {"n": 1})
            await until(lambda: len(rec.received) >= 2, "a retry after the timeout")
            rec.delay = 0.0
            await until(lambda: _zero(s), "delivered in the end")
        finally:
            await s.stop()
    assert len({h["webhook-id"] for h, _ in rec.received}) == 1


async def test_gives_up_after_the_last_retry(
    redis_client: Any, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    async with receiver() as rec:
        rec.statuses = [500] * 10
        s = sender(redis_client, keys, rec.url, schedule="10ms,10ms")
        await s.start()
        try:
            await s.enqueue("credentials.expired", {"n": 1})
            await until(lambda: len(rec.received) == 3, "three attempts")
            await until(lambda: _zero(s), "dropped after the last retry")
        finally:
            await s.stop()
    assert len(rec.received) == 3
    assert any("given up" in r.getMessage() for r in caplog.records)
    assert all(SECRET not in r.getMessage() for r in caplog.records)


async def test_pending_deliveries_survive_a_restart_of_the_sender(redis_client: Any, keys: Keys) -> None:
    async with receiver() as rec:
        rec.statuses = [500]
        first = sender(redis_client, keys, rec.url, schedule="300ms")
        await first.start()
        a = await first.enqueue("credentials.expired", {"n": 1})
        await until(lambda: len(rec.received) == 1, "the first attempt failed")
        await first.stop()  # "crash" with a retry pending
        stopped = sender(redis_client, keys, rec.url)
        b = await stopped.enqueue("credentials.expired", {"n": 2})  # stored while nothing delivers
        assert await stopped.pending() == 2
        second = sender(redis_client, keys, rec.url)
        await second.start()
        try:
            await until(lambda: _zero(second), "both delivered by the new sender")
        finally:
            await second.stop()
    assert [h["webhook-id"] for h, _ in rec.received].count(a) == 2
    assert [h["webhook-id"] for h, _ in rec.received].count(b) == 1


async def test_two_replicas_never_send_the_same_attempt(redis_client: Any, keys: Keys) -> None:
    async with receiver() as rec:
        one, two = sender(redis_client, keys, rec.url), sender(redis_client, keys, rec.url)
        ids = [await one.enqueue("credentials.expired", {"n": n}) for n in range(20)]
        await one.start()
        await two.start()
        try:
            await until(lambda: _zero(one), "all delivered")
        finally:
            await one.stop()
            await two.stop()
    assert sorted(h["webhook-id"] for h, _ in rec.received) == sorted(ids)


async def test_enqueueing_the_same_id_twice_sends_once(redis_client: Any, keys: Keys) -> None:
    async with receiver() as rec:
        s = sender(redis_client, keys, rec.url)
        await s.enqueue("credentials.expired", {"n": 1}, webhook_id="msg_fixed")
        await s.enqueue("credentials.expired", {"n": 1}, webhook_id="msg_fixed")
        await s.start()
        try:
            await until(lambda: _zero(s), "delivered")
        finally:
            await s.stop()
    assert [h["webhook-id"] for h, _ in rec.received] == ["msg_fixed"]


async def test_without_a_url_enqueue_stores_nothing(redis_client: Any, keys: Keys) -> None:
    s = WebhookSender(redis_client, keys, url=None, secret=None)
    await s.start()
    webhook_id = await s.enqueue("credentials.expired", {"n": 1})
    assert webhook_id.startswith("msg_")
    assert await s.pending() == 0
    await s.stop()
