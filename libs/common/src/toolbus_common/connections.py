"""NATS, JetStream and Redis connections, and idempotent creation of streams and buckets."""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore
from redis.asyncio import BlockingConnectionPool, Redis

from toolbus_common.settings import Settings

log = logging.getLogger(__name__)


async def connect_nats(settings: Settings, name: str) -> NatsClient:
    """Connect with endless reconnects; connection changes are logged, never raised into handlers."""

    async def on_error(exc: Exception) -> None:
        log.warning("nats error", extra={"error": type(exc).__name__, "detail": str(exc)})

    async def on_disconnect() -> None:
        log.warning("nats disconnected")

    async def on_reconnect() -> None:
        log.info("nats reconnected")

    return await nats.connect(
        settings.nats_url,
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        error_cb=on_error,
        disconnected_cb=on_disconnect,
        reconnected_cb=on_reconnect,
    )


async def close_nats(nc: NatsClient) -> None:
    """Close a service's connection once its requests are drained (`RpcServer.drain`): send what
    is still buffered (replies, events), then close. Not `nc.drain()`: it also waits on pull
    consumers that `fetch()` read, up to its 30 s timeout, which stalls every shutdown."""
    with contextlib.suppress(Exception):
        await nc.flush(timeout=5)
    with contextlib.suppress(Exception):
        await nc.close()


def connect_redis(settings: Settings) -> Redis[bytes]:
    """An asyncio Redis client returning bytes on a bounded, blocking pool: under load a command
    waits up to `redis_pool_timeout` for a connection instead of failing at once (redis-py's
    default pool raises `MaxConnectionsError` when its 100 connections are busy)."""
    pool: BlockingConnectionPool[Any] = BlockingConnectionPool.from_url(
        settings.redis_url,
        max_connections=settings.redis_pool_size,
        timeout=settings.redis_pool_timeout,
        decode_responses=False,
        health_check_interval=30,
    )
    # The client owns the pool and closes it with itself (stubs predate `from_pool`).
    client: Redis[bytes] = Redis.from_pool(pool)  # type: ignore[attr-defined]
    return client


async def ensure_stream(
    js: JetStreamContext,
    name: str,
    subjects: list[str],
    *,
    max_age: timedelta | None = None,
    retention: RetentionPolicy = RetentionPolicy.LIMITS,
) -> None:
    """Create the stream, or update its subjects; works on JetStream 2.9."""
    config = StreamConfig(
        name=name,
        subjects=subjects,
        retention=retention,
        storage=StorageType.FILE,
        max_age=max_age.total_seconds() if max_age else None,
    )
    try:
        info = await js.stream_info(name)
    except NotFoundError:
        await js.add_stream(config)
        return
    if sorted(info.config.subjects or []) != sorted(subjects):
        await js.update_stream(config)


async def ensure_kv(js: JetStreamContext, bucket: str, *, history: int = 1) -> KeyValue:
    try:
        return await js.key_value(bucket)
    except (BucketNotFoundError, NotFoundError):
        return await js.create_key_value(bucket=bucket, history=history, storage=StorageType.FILE)


async def ensure_object_store(js: JetStreamContext, bucket: str) -> ObjectStore:
    try:
        return await js.object_store(bucket)
    except (BucketNotFoundError, NotFoundError):
        return await js.create_object_store(bucket=bucket, storage=StorageType.FILE)
