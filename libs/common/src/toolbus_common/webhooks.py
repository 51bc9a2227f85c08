"""Standard Webhooks sender with durable, retried deliveries.

`enqueue` stores a delivery in Redis before it returns (or a service's Lua script stores it with the
state change it follows, `LUA`), so a restart loses none; `start()` runs a
loop that sends due deliveries. Any replica may deliver: a Lua script claims due deliveries by
pushing their due time past a lease, so two replicas never send the same attempt at once (a
replica that dies mid-send leaves the delivery due again when the lease runs out: at-least-once,
the receiver deduplicates on `webhook-id`).

Each attempt is a POST of `{"type": ..., "data": ...}` with the headers `webhook-id` (the same on
every attempt), `webhook-timestamp` (of this attempt) and `webhook-signature: v1,<base64
HMAC-SHA256 of "<id>.<timestamp>.<body>">`. Signing key `TOOLBUS_WEBHOOK_SECRET`: `whsec_<base64>`
is base64-decoded (the Standard Webhooks convention); any other value is used as raw UTF-8 bytes.
A 2xx answer is success; anything else, or no answer within the timeout, is retried after the
next delay of `TOOLBUS_WEBHOOK_RETRY_SCHEDULE` (default `5s,30s,2m,10m,1h`); after the last the
delivery is dropped and logged (never the secret).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
from prometheus_client import Counter
from pydantic import BaseModel, SecretStr, field_validator
from redis.asyncio import Redis
from standardwebhooks import Webhook
from toolbus_contracts import parse_duration

from toolbus_common.keys import Keys
from toolbus_common.outages import expected_fault
from toolbus_common.redis_values import text
from toolbus_common.tasks import cancel_and_wait

log = logging.getLogger(__name__)

DEFAULT_SCHEDULE = "5s,30s,2m,10m,1h"

DELIVERIES = Counter(
    "toolbus_webhook_attempts_total",
    "Webhook delivery attempts, by event type and result",
    ["type", "result"],
)

LUA = """
-- Store a webhook delivery (toolbus_common.webhooks), due now; once per webhook id while stored.
local function webhook_add(key, due, type, body, now_ms, id)
  if redis.call('EXISTS', key) == 1 then return 0 end
  redis.call('HSET', key, 'type', type, 'body', body, 'attempt', 0, 'createdAt', now_ms)
  redis.call('ZADD', due, now_ms, id)
  return 1
end
"""
"""The Lua function that stores a delivery: `enqueue` runs it, and a script that owes a webhook
with the state change it makes prepends and calls it (the delivery's layout)."""

_ENQUEUE = LUA + "return webhook_add(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4])"


def webhook_body(event_type: str, data: dict[str, Any]) -> bytes:
    """What a delivery POSTs: `{"type": ..., "data": ...}`."""
    return orjson.dumps({"type": event_type, "data": data})


# Claim up to ARGV[3] deliveries due at ARGV[1]: each is pushed to ARGV[2] (now + lease), so no
# other replica takes it while this one sends.
_CLAIM = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(ids) do redis.call('ZADD', KEYS[1], ARGV[2], id) end
return ids
"""


def parse_schedule(text: str) -> tuple[float, ...]:
    """`"5s,30s,2m"` -> delays in seconds; `ValueError` naming the bad entry."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError("TOOLBUS_WEBHOOK_RETRY_SCHEDULE is empty: give delays like 5s,30s,2m,10m,1h")
    try:
        return tuple(parse_duration(p).total_seconds() for p in parts)
    except ValueError as exc:
        raise ValueError(f"TOOLBUS_WEBHOOK_RETRY_SCHEDULE: {exc}") from None


class WebhookSettings(BaseModel):
    """What the services that send webhooks (approval, credentials) read, mixed into their own
    settings (`class ApprovalSettings(WebhookSettings, BaseSettings)`: a `BaseSettings` here would
    count as read by every service): `TOOLBUS_WEBHOOK_RETRY_SCHEDULE` (delays between attempts,
    default `5s,30s,2m,10m,1h`) and `TOOLBUS_WEBHOOK_TIMEOUT` (how long one attempt may take,
    default 10s)."""

    webhook_retry_schedule: str = DEFAULT_SCHEDULE
    webhook_timeout: str = "10s"

    @field_validator("webhook_retry_schedule")
    @classmethod
    def _schedule(cls, value: str) -> str:
        parse_schedule(value)
        return value

    @field_validator("webhook_timeout")
    @classmethod
    def _timeout(cls, value: str) -> str:
        parse_duration(value)  # refuses zero, negative and malformed durations
        return value

    @property
    def webhook_timeout_seconds(self) -> float:
        return parse_duration(self.webhook_timeout).total_seconds()


def signer(secret: str) -> Webhook:
    """The Standard Webhooks signer of `secret` (`whsec_<base64>`, or raw text used as bytes)."""
    if secret.startswith("whsec_"):
        try:
            return Webhook(secret)
        except Exception:
            raise ValueError("TOOLBUS_WEBHOOK_SECRET starts with whsec_ but is not valid base64") from None
    if not secret:
        raise ValueError("TOOLBUS_WEBHOOK_SECRET is empty")
    return Webhook(secret.encode())


class WebhookSender:
    """Durable Standard Webhooks deliveries to one URL. With no URL, `enqueue` logs and does
    nothing else (webhooks are off)."""

    def __init__(
        self,
        redis: Redis[bytes],
        keys: Keys,
        *,
        url: str | None,
        secret: str | SecretStr | None,
        schedule: Sequence[float] | str = DEFAULT_SCHEDULE,
        timeout: float = 10.0,
        poll_interval: float = 1.0,
        batch: int = 16,
        http: httpx.AsyncClient | None = None,
        queue: tuple[str, Callable[[str], str]] | None = None,
    ) -> None:
        self._redis = redis
        # The deliveries' index and each delivery's key: the deployment's shared queue unless a
        # service's scripts store deliveries under a hash tag of their own (`queue`).
        self._due, self._delivery = queue or (keys.webhooks_due, keys.webhook)
        self.url = url or None
        raw_secret = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
        if self.url and not raw_secret:
            raise ValueError("TOOLBUS_WEBHOOK_SECRET is required when TOOLBUS_WEBHOOK_URL is set")
        self._signer = signer(raw_secret) if self.url and raw_secret else None
        self.schedule = parse_schedule(schedule) if isinstance(schedule, str) else tuple(schedule)
        self.timeout = timeout
        self._poll = poll_interval
        self._batch = batch
        self._lease = timeout + 30.0
        self._http = http
        self._own_http = http is None
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._enqueue = redis.register_script(_ENQUEUE)
        self._claim = redis.register_script(_CLAIM)

    @property
    def enabled(self) -> bool:
        return self.url is not None

    async def enqueue(self, event_type: str, data: dict[str, Any], *, webhook_id: str | None = None) -> str:
        """Store the delivery durably and return its webhook id. Enqueueing the same `webhook_id`
        again is a no-op (so a redelivered command never sends a second webhook)."""
        webhook_id = webhook_id or f"msg_{uuid.uuid4().hex}"
        if not self.enabled:
            log.info("webhook not sent: TOOLBUS_WEBHOOK_URL is unset", extra={"webhookType": event_type})
            return webhook_id
        body = webhook_body(event_type, data)
        now_ms = int(time.time() * 1000)
        await self._enqueue(
            keys=[self._delivery(webhook_id), self._due],
            args=[event_type, body, now_ms, webhook_id],
        )
        self._wake.set()
        return webhook_id

    def wake(self) -> None:
        """Look for due deliveries now (one was stored by a script of the caller's, not `enqueue`)."""
        self._wake.set()

    async def start(self) -> None:
        """Run the delivery loop in the background (no-op when webhooks are off)."""
        if not self.enabled or self._task is not None:
            return
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self.timeout)
        self._task = asyncio.create_task(self._loop(), name="webhook-deliveries")

    async def stop(self, grace: float = 5.0) -> None:
        """Stop claiming; let attempts in flight finish (up to `grace`); unfinished ones stay
        stored and are sent after their lease by any replica."""
        if self._task is not None:
            self._stopping = True
            self._wake.set()
            await asyncio.wait({self._task}, timeout=grace)
            await cancel_and_wait(self._task)
            self._task = None
            self._stopping = False
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=grace)
            for task in set(self._inflight):
                task.cancel()
        if self._own_http and self._http is not None:
            await self._http.aclose()
            self._http = None

    async def pending(self) -> int:
        """How many deliveries are stored and not yet done."""
        return int(await self._redis.zcard(self._due))

    async def _loop(self) -> None:
        while not self._stopping:
            try:
                await self.deliver_due()
            except Exception as exc:
                if not expected_fault(exc, "webhook delivery"):
                    log.exception("webhook delivery loop failed; retrying")
            self._wake.clear()
            if self._stopping:
                break
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that races
            # with the event being set, and the loop would never end.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll):
                    await self._wake.wait()

    async def deliver_due(self) -> int:
        """Claim the deliveries due now and send each once (in the background); returns how many
        were claimed."""
        free = self._batch - len(self._inflight)
        if free <= 0:
            return 0
        now = time.time()
        ids = await self._claim(
            keys=[self._due],
            args=[int(now * 1000), int((now + self._lease) * 1000), free],
        )
        for raw in ids:
            task = asyncio.create_task(self._attempt(text(raw)))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
        return len(ids)

    async def _attempt(self, webhook_id: str) -> None:
        key = self._delivery(webhook_id)
        stored = await self._redis.hgetall(key)
        if not stored:
            await self._redis.zrem(self._due, webhook_id)
            return
        event_type = stored[b"type"].decode()
        body = stored[b"body"]
        attempt = int(stored.get(b"attempt", b"0")) + 1
        ok, why = await self._send(webhook_id, body)
        DELIVERIES.labels(event_type, "ok" if ok else "failed").inc()
        extra = {"webhookId": webhook_id, "webhookType": event_type, "attempt": attempt}
        if ok:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(key)
                pipe.zrem(self._due, webhook_id)
                await pipe.execute()
            log.info("webhook delivered", extra=extra)
            return
        if attempt > len(self.schedule):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(key)
                pipe.zrem(self._due, webhook_id)
                await pipe.execute()
            log.error("webhook given up after its last retry", extra={**extra, "reason": why})
            return
        delay = self.schedule[attempt - 1]
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, "attempt", attempt)
            pipe.zadd(self._due, {webhook_id: int((time.time() + delay) * 1000)})
            await pipe.execute()
        log.warning("webhook attempt failed; will retry", extra={**extra, "reason": why, "retryIn": delay})

    async def _send(self, webhook_id: str, body: bytes) -> tuple[bool, str]:
        if self._signer is None or self._http is None or self.url is None:
            raise RuntimeError("WebhookSender.start() was not awaited or webhooks are off")
        now = datetime.now(UTC)
        headers = {
            "content-type": "application/json",
            "webhook-id": webhook_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": self._signer.sign(webhook_id, now, body.decode()),
        }
        try:
            response = await self._http.post(self.url, content=body, headers=headers, timeout=self.timeout)
        except httpx.TimeoutException:
            return False, "timeout"
        except httpx.HTTPError as exc:
            return False, type(exc).__name__
        if 200 <= response.status_code < 300:
            return True, ""
        return False, f"status {response.status_code}"
