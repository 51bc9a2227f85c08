"""What the tests share on top of `toolbus_devstack` (real NATS, Redis and services on this
machine): async service processes, fresh prefixes, raw requests, cleanup and liveness waits.

The names of `toolbus_devstack` are re-exported, so tests import all of it from here.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import toolbus_devstack
from toolbus_common.settings import stream_name
from toolbus_devstack import *  # noqa: F403 - the tests import all of it from here
from toolbus_devstack import ServiceProcess, launch_service, stop_process, wait_ready

__all__ = [
    *toolbus_devstack.__all__,
    "aservice_process",
    "drop_deployment_state",
    "drop_redis_keys",
    "js_name",
    "request",
    "unique_prefix",
    "until",
]


@contextlib.asynccontextmanager
async def aservice_process(
    name: str, env: Mapping[str, str], *, ready_timeout: float = 60.0, **kwargs: Any
) -> AsyncIterator[ServiceProcess]:
    """`service_process` for async tests: the readiness wait and the stop run off the event loop."""
    import asyncio

    # Spawned on this thread (the main one under pytest) so PDEATHSIG ties it to the session.
    service = launch_service(name, env, **kwargs)
    try:
        await asyncio.to_thread(
            wait_ready,
            service.ready_url,
            service.proc,
            service.log_path,
            what=f"toolbus_{name}",
            timeout=ready_timeout,
        )
        yield service
    finally:
        await asyncio.to_thread(stop_process, service.proc)


# ---- prefixes and requests ---------------------------------------------------------------------


def unique_prefix(stem: str = "tbt") -> str:
    """A subject / Redis key prefix no other run uses: `stem` + 8 hex digits (`[a-z0-9]` only)."""
    return f"{stem}{secrets.token_hex(4)}"


def js_name(prefix: str, name: str) -> str:
    """The stream / bucket name a service derives from a subject prefix (`Settings.js_name`)."""
    return stream_name(prefix, name)


async def request(
    nc: Any,
    subject: str,
    body: dict[str, Any] | bytes,
    timeout: float = 5.0,
) -> dict[str, Any]:
    """Send `body` as raw JSON (bytes go as they are) to `subject`; return the parsed reply.

    Raises nats' `NoRespondersError` / `TimeoutError` as they come, and `ValueError` when the reply
    is not a JSON object.
    """
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    msg = await nc.request(subject, data, timeout=timeout)
    reply = json.loads(msg.data)
    if not isinstance(reply, dict):
        raise ValueError(f"reply on {subject} is not a JSON object: {msg.data[:200]!r}")
    return reply


async def request_ok(nc: Any, subject: str, body: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
    """`request`, asserting the reply is `ok` (the reply shown when not); its `data`."""
    reply = await request(nc, subject, body, timeout=timeout)
    assert reply["ok"] is True, reply
    data: dict[str, Any] = reply["data"]
    return data


async def drop_deployment_state(nc: Any, redis_url: str, prefix: str) -> None:
    """Delete what a deployment under `prefix` left: its streams, KV buckets and object stores
    (events, internal commands, toolsets, workflows) and its Redis keys. For tests that run
    services under a prefix of their own."""
    import contextlib

    js = nc.jetstream()
    for name in ("EVENTS", "INTERNAL", "toolsets", "workflows", "outputs", "embeddings"):
        for stream in (js_name(prefix, name), f"OBJ_{js_name(prefix, name)}", f"KV_{js_name(prefix, name)}"):
            with contextlib.suppress(Exception):
                await js.delete_stream(stream)
    await drop_redis_keys(redis_url, prefix)


async def drop_redis_keys(redis_url: str, prefix: str) -> None:
    """Delete the Redis keys of a deployment under `prefix`."""
    from redis.asyncio import Redis

    redis: Any = Redis.from_url(redis_url)
    keys = [k async for k in redis.scan_iter(match=f"{prefix}:*", count=500)]
    for start in range(0, len(keys), 500):
        await redis.unlink(*keys[start : start + 500])
    await redis.aclose()


async def eventually(
    check: Callable[[], Awaitable[Any]], what: str, limit: float = 30.0, pause: float = 0.2
) -> Any:
    """`check()`'s first true result, `check` called again every `pause` seconds and its errors
    retried (a stream's leader being elected, a connection coming back) until `limit` seconds
    have passed: a liveness bound, not a timing assertion."""
    import asyncio
    import time

    deadline = time.monotonic() + limit
    while True:
        try:
            if result := await check():
                return result
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {limit} s: {what}")
        await asyncio.sleep(pause)


async def until(check: Callable[[], bool | Awaitable[bool]], what: str, limit: float = 10.0) -> None:
    """Wait for `check` to hold (a liveness bound, not a timing assertion)."""
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.02)
