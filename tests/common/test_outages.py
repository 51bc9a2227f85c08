"""An outage of Redis is two log lines whatever meets it meanwhile: one warning at the first
failure, one line when the probe finds it back with the count of `unavailable` replies; a NATS
fault is one line without a traceback; anything else is the caller's to log as a bug."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from toolbus_common.bus import failure
from toolbus_common.connections import connect_redis
from toolbus_common.outages import REDIS, Outage, expected_fault
from toolbus_common.settings import Settings
from toolbus_contracts.errors import Unavailable


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "toolbus_common.outages"]


async def test_an_outage_is_one_warning_and_one_recovery_line_with_the_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    up = asyncio.Event()

    async def probe() -> None:
        if not up.is_set():
            raise RedisConnectionError("still away")

    outage = Outage("Redis", period=0.01)
    outage.watch(probe)
    for _ in range(5):
        outage.fault(RedisConnectionError("gone"))
    for _ in range(3):
        outage.answered_unavailable()
    await asyncio.sleep(0.05)
    assert outage.down and len(lines(caplog)) == 1
    up.set()
    for _ in range(100):
        if not outage.down:
            break
        await asyncio.sleep(0.01)
    assert lines(caplog) == [
        "Redis unreachable; requests that need it are answered unavailable until it is back",
        "Redis reachable again",
    ]
    back = next(r for r in caplog.records if r.getMessage() == "Redis reachable again")
    assert back.__dict__["unavailableReplies"] == 3
    assert all(r.exc_info is None for r in caplog.records)


async def test_requests_failing_on_redis_are_counted_not_logged_each(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO)
    redis = Outage("Redis", period=0.01)
    monkeypatch.setattr("toolbus_common.framework.replies.REDIS", redis)
    up = asyncio.Event()

    async def probe() -> None:
        if not up.is_set():
            raise RedisConnectionError("away")

    redis.watch(probe)
    for _ in range(20):
        reply = failure(RedisConnectionError("Connection closed by server."), "tb.calls.get")
        assert isinstance(reply, Unavailable)
    await asyncio.sleep(0.05)  # the probe finds Redis away
    assert len(caplog.records) == 1 and caplog.records[0].levelno == logging.WARNING
    up.set()
    for _ in range(100):
        if not redis.down:
            break
        await asyncio.sleep(0.01)
    back = caplog.records[-1]
    assert back.getMessage() == "Redis reachable again" and back.__dict__["unavailableReplies"] == 20


def test_a_bug_is_not_an_expected_fault_and_nats_is_one_line(caplog: pytest.LogCaptureFixture) -> None:
    import nats.errors

    caplog.set_level(logging.INFO)
    assert not expected_fault(KeyError("bug"), "sweep")
    assert expected_fault(nats.errors.TimeoutError(), "sweep")
    assert [r.getMessage() for r in caplog.records] == ["sweep: a backing store did not answer"]
    assert caplog.records[0].exc_info is None


async def test_a_failure_the_probe_contradicts_is_one_info_line_not_an_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)

    async def answers() -> None:
        return None

    outage = Outage("Redis", period=0.01)
    outage.watch(answers)
    outage.fault(RedisConnectionError("one connection dropped"))
    outage.answered_unavailable()
    for _ in range(100):
        if not outage.down:
            break
        await asyncio.sleep(0.01)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "a Redis connection failed; Redis answers")
    ]
    assert caplog.records[0].__dict__["unavailableReplies"] == 1


async def test_a_forgotten_probe_is_not_asked_again_and_another_takes_over() -> None:
    asked: list[str] = []
    up = asyncio.Event()

    def probe(name: str) -> Callable[[], Awaitable[None]]:
        async def ask() -> None:
            asked.append(name)
            if not up.is_set():
                raise RedisConnectionError("away")

        return ask

    closing, staying = probe("closing"), probe("staying")
    outage = Outage("Redis", period=0.01)
    outage.watch(staying)
    outage.watch(closing)
    outage.fault(RedisConnectionError("gone"))
    for _ in range(500):
        if "closing" in asked:
            break
        await asyncio.sleep(0.01)
    await outage.forget(closing)
    after = len(asked)
    up.set()
    for _ in range(500):
        if not outage.down:
            break
        await asyncio.sleep(0.01)
    assert not outage.down
    assert "closing" not in asked[after:] and asked[-1] == "staying"


@pytest.mark.integration
async def test_a_closed_client_is_not_connected_again_by_the_outage_probe(redis_url: str) -> None:
    """The leak once seen as an unclosed Connection and StreamWriter found at GC during another
    test: the process-wide probe PINGed a client its service had closed, connecting it again."""
    settings = Settings(redis_url=redis_url)
    other: Any = connect_redis(settings)
    client: Any = connect_redis(settings)  # the latest: the one the probe asks
    try:
        await client.ping()
        REDIS.fault(RedisConnectionError("one connection dropped"))  # the probe starts
        await client.aclose()
        await asyncio.sleep(REDIS.period * 3)  # probes would have come and gone
        pool = client.connection_pool
        connected = [c for c in (*pool._available_connections, *pool._in_use_connections) if c.is_connected]
        assert connected == []
        assert not REDIS.down  # the other client's PING ended it
    finally:
        await other.aclose()
