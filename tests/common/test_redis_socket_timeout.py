"""The pooled redis-py client of every service has a socket timeout (`TOOLBUS_REDIS_SOCKET_TIMEOUT`)
and TCP keepalive: against a real Redis behind a TCP proxy that goes silent (commands arrive,
answers never come back, nothing is closed), a command fails after about the timeout instead of
waiting forever, and the approval service answers `unavailable` meanwhile and carries on (lists,
takes new approvals) once Redis answers again."""

from __future__ import annotations

import asyncio
import inspect
import socket
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import redis.exceptions
from pydantic import ValidationError
from redis.asyncio import Redis
from toolbus_approval.app import ApprovalApp
from toolbus_approval.settings import ApprovalSettings
from toolbus_common.connections import connect_redis, connect_script_pipe
from toolbus_common.settings import REDIS_LONGEST_BLOCK, Settings
from toolbus_contracts import Subjects

from tests.approval.test_approval_service import Stack, needed
from tests.support.commands import TEST_SECRET_KEY
from tests.support.cutting_proxy import CuttingProxy, proxy_to
from tests.support.infra import eventually, request

pytestmark = pytest.mark.integration

TIMEOUT = 2.0


@pytest_asyncio.fixture(loop_scope="session")
async def proxy(redis_url: str) -> AsyncIterator[CuttingProxy]:
    async with proxy_to(redis_url) as p:
        yield p


def test_the_timeout_must_exceed_the_longest_blocking_command() -> None:
    from toolbus_common.outbox import OutboxRelay

    relay_block_ms = inspect.signature(OutboxRelay).parameters["block_ms"].default
    assert relay_block_ms / 1000 <= REDIS_LONGEST_BLOCK
    assert Settings().redis_socket_timeout == 10.0
    with pytest.raises(ValidationError, match="redis_socket_timeout"):
        Settings(redis_socket_timeout=REDIS_LONGEST_BLOCK)


def test_every_pooled_connection_and_the_pipe_take_the_setting() -> None:
    settings = Settings(redis_socket_timeout=7.5)
    client = connect_redis(settings)
    connection: Any = client.connection_pool.make_connection()
    assert (connection.socket_timeout, connection.socket_connect_timeout) == (7.5, 7.5)
    assert connection.socket_keepalive
    assert connection.socket_keepalive_options[socket.TCP_KEEPIDLE] == 8
    assert connection.socket_keepalive_options[socket.TCP_KEEPCNT] == 3
    assert connect_script_pipe(settings, client).reply_timeout == 7.5
    # The Sentinel path: the master's pool has the same socket options.
    sentinel = connect_redis(Settings(redis_socket_timeout=7.5, redis_sentinels="127.0.0.1:1"))
    kwargs = sentinel.connection_pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_keepalive"]) == (7.5, True)


async def test_a_command_on_a_silent_connection_fails_after_the_timeout(
    proxy: CuttingProxy, redis_prefix: str
) -> None:
    key = f"{redis_prefix}:socket-timeout:{uuid.uuid4().hex}"
    client = connect_redis(Settings(redis_url=proxy.url, redis_socket_timeout=TIMEOUT))
    unbounded: Any = Redis.from_url(proxy.url, socket_timeout=None)
    try:
        await client.set(key, b"1", ex=60)
        assert await unbounded.get(key) == b"1"
        proxy.silence()
        # Without a timeout the command would wait for as long as Redis stays silent.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(unbounded.get(key), 3 * TIMEOUT)
        started = time.monotonic()
        with pytest.raises(redis.exceptions.TimeoutError):
            await asyncio.wait_for(client.get(key), 60)  # the outer bound only guards the test
        waited = time.monotonic() - started
        print(f"\nsilent Redis: the pooled client's GET failed after {waited:.2f} s (timeout {TIMEOUT} s)")
        assert waited >= TIMEOUT * 0.9
        assert proxy.swallowed > 0
        proxy.speak()
        # The timed-out connection was dropped: the next command gets a working one.
        assert await eventually(lambda: client.get(key), "an answer once Redis speaks") == b"1"
    finally:
        proxy.speak()
        await client.aclose()  # type: ignore[attr-defined]  # redis>=5; stubs lag
        await unbounded.aclose()


async def test_the_approval_service_answers_unavailable_then_carries_on(
    proxy: CuttingProxy, nats_url: str, prefix: str, redis_prefix: str, nc: Any, js: Any, redis_client: Any
) -> None:
    settings = Settings(
        nats_url=nats_url,
        redis_url=proxy.url,
        subject_prefix=prefix,
        redis_prefix=redis_prefix,
        redis_socket_timeout=TIMEOUT,
        secret_key=TEST_SECRET_KEY,
    )
    subjects = Subjects(prefix)
    stack = Stack(nc, js, redis_client, prefix)
    app = ApprovalApp(settings, ApprovalSettings(approval_sweep_interval=0.2))
    await app.start()
    try:
        run_id = f"run_{uuid.uuid4().hex[:12]}"
        listed = await request(nc, subjects.approvals_list, {"runId": run_id}, timeout=30)
        assert listed["ok"] and listed["data"]["approvals"] == [], listed
        proxy.silence()
        started = time.monotonic()
        reply = await request(nc, subjects.approvals_list, {"runId": run_id}, timeout=60)
        waited = time.monotonic() - started
        print(f"\nsilent Redis: approvals.list answered {reply['error']['code']} after {waited:.2f} s")
        assert reply["ok"] is False and reply["error"]["code"] == "unavailable", reply
        proxy.speak()

        async def answers() -> bool:
            again = await request(nc, subjects.approvals_list, {"runId": run_id}, timeout=30)
            return bool(again["ok"])

        await eventually(answers, "approvals.list answered once Redis speaks")
        command = needed(run_id=run_id)
        await stack.send(command)

        async def listed_now() -> bool:
            got = await request(nc, subjects.approvals_list, {"runId": run_id}, timeout=30)
            return got["ok"] and [a["approvalId"] for a in got["data"]["approvals"]] == [command.approval_id]

        await eventually(listed_now, "a new approval taken after the silence")
        assert app.ready()
    finally:
        proxy.speak()
        await app.stop()
