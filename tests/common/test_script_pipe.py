"""The hot-path Redis script pipe against real Redis, under asyncio and uvloop."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
import uvloop
from redis.asyncio import Redis
from toolbus_common.script_pipe import NoScript, PipeConnectionError, ScriptPipe, ScriptReplyError

pytestmark = pytest.mark.integration

ECHO = "return {KEYS[1], ARGV[1], tonumber(ARGV[2]) + 1}"


async def _scenario(redis_url: str, key: str) -> list[Any]:
    redis: Any = Redis.from_url(redis_url)
    pipe = ScriptPipe(redis_url)
    try:
        sha = await redis.script_load(ECHO)
        results = await asyncio.gather(*(pipe.evalsha(sha, [f"{key}:{i}"], [f"v{i}", i]) for i in range(200)))
        with pytest.raises(NoScript):
            await pipe.evalsha("0" * 40, [], [])
        bad = await redis.script_load("return redis.call('INCR', KEYS[1])")
        await redis.set(key, "not a number")
        with pytest.raises(ScriptReplyError):
            await pipe.evalsha(bad, [key], [])
        # The server drops the connection: the next call reconnects.
        assert pipe._protocol is not None and pipe._protocol.transport is not None
        host, port = pipe._protocol.transport.get_extra_info("sockname")[:2]
        await redis.execute_command("CLIENT", "KILL", "ADDR", f"{host}:{port}")  # only the pipe's
        await asyncio.sleep(0.05)
        after = await pipe.evalsha(sha, [key], ["after", 41])
        # Nothing listening: a clear connection error, not a hang.
        from tests.support.infra import free_port

        with pytest.raises(PipeConnectionError):
            await ScriptPipe(f"redis://127.0.0.1:{free_port()}/0", connect_timeout=1).evalsha(sha, [], [])
        return [*results, after]
    finally:
        await pipe.aclose()
        await redis.delete(key)
        await redis.aclose()


def _check(results: list[Any], key: str) -> None:
    assert results[:200] == [[f"{key}:{i}".encode(), f"v{i}".encode(), i + 1] for i in range(200)]
    assert results[200] == [key.encode(), b"after", 42]


def test_replies_match_their_calls_in_order_errors_and_reconnects_uvloop(
    redis_url: str, redis_prefix: str
) -> None:
    key = f"{redis_prefix}:pipe:uv"
    _check(uvloop.run(_scenario(redis_url, key)), key)


def test_replies_match_their_calls_in_order_errors_and_reconnects_asyncio(
    redis_url: str, redis_prefix: str
) -> None:
    key = f"{redis_prefix}:pipe:aio"
    _check(asyncio.run(_scenario(redis_url, key)), key)


def test_database_and_password_come_from_the_url() -> None:
    pipe = ScriptPipe("redis://user:p%40ss@10.0.0.1:6380/3")
    assert (pipe._host, pipe._port, pipe._db, pipe._username, pipe._password) == (
        "10.0.0.1",
        6380,
        3,
        "user",
        "p@ss",
    )
    with pytest.raises(ValueError, match="redis://"):
        ScriptPipe("http://host/0")
    assert ScriptPipe("rediss://host/0")._ssl is not None


async def test_a_connection_that_stops_answering_is_closed_after_the_reply_timeout(redis_url: str) -> None:
    # A Redis that vanished without a reset: the proxy keeps the connection open and drops the
    # answer. The command fails with PipeConnectionError once it waited `reply_timeout` (the
    # outer bound is a liveness limit, not a timing assertion); the next one reconnects.
    from urllib.parse import urlsplit

    from tests.support.cutting_proxy import CuttingProxy

    parts = urlsplit(redis_url)
    proxy = await CuttingProxy(parts.hostname or "127.0.0.1", parts.port or 6379).start()
    redis: Any = Redis.from_url(redis_url)
    pipe = ScriptPipe(proxy.url, reply_timeout=0.5)
    try:
        sha = await redis.script_load(ECHO)
        assert await pipe.evalsha(sha, ["k"], ["before", 1]) == [b"k", b"before", 2]
        proxy.arm(sha.encode(), stall=True)
        async with asyncio.timeout(30):
            with pytest.raises(PipeConnectionError):
                await pipe.evalsha(sha, ["k"], ["lost", 1])
        assert proxy.cuts == 1
        assert await pipe.evalsha(sha, ["k"], ["after", 1]) == [b"k", b"after", 2]
    finally:
        await pipe.aclose()
        await proxy.stop()
        await redis.aclose()


def test_commands_are_encoded_as_resp() -> None:
    # hiredis.pack_command: bytes, str (UTF-8), int and float (repr) as bulk strings.
    from toolbus_common.script_pipe import _encode

    assert _encode(("EVALSHA", b"ab", 2, "k\u00e9", 1.5, 0.1)) == (
        b"*6\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n2\r\n$3\r\nk\xc3\xa9\r\n$3\r\n1.5\r\n$3\r\n0.1\r\n"
    )


async def test_stream_commands_for_the_event_relay(redis_url: str, redis_prefix: str) -> None:
    # What the relay sends over a pipe of its own: XREAD (BLOCK, nil when nothing came), XDEL;
    # a command pipelined behind a blocking read is answered after it, in order.
    redis: Any = Redis.from_url(redis_url)
    pipe, other = ScriptPipe(redis_url), ScriptPipe(redis_url)
    key = f"{redis_prefix}:pipe:stream"
    try:
        assert await pipe.execute("XREAD", "COUNT", 10, "BLOCK", 50, "STREAMS", key, "0-0") is None
        read = asyncio.ensure_future(pipe.execute("XREAD", "COUNT", 10, "BLOCK", 5000, "STREAMS", key, "$"))
        behind = asyncio.ensure_future(pipe.execute("XLEN", key))
        await asyncio.sleep(0.05)
        eid = await other.execute("XADD", key, "*", "i", "c:1", "b", b"\x00body")
        async with asyncio.timeout(30):
            got = await read
            assert await behind == 1
        assert got == [[key.encode(), [[eid, [b"i", b"c:1", b"b", b"\x00body"]]]]]
        assert await pipe.execute("XDEL", key, eid) == 1
        assert await redis.xlen(key) == 0
        with pytest.raises(ScriptReplyError):
            await pipe.execute("XDEL")
    finally:
        await pipe.aclose()
        await other.aclose()
        await redis.delete(key)
        await redis.aclose()


async def test_aclose_during_a_connect_leaves_no_connection_open(redis_url: str) -> None:
    """A command cancelled while its pipe was still connecting (a service stopping) leaves the
    connect running, shielded; `aclose()` must close what it makes, or a socket is left open."""
    import gc
    import warnings

    pipe = ScriptPipe(redis_url)
    waiting = asyncio.ensure_future(pipe.execute("PING"))
    await asyncio.sleep(0)  # the connect is under way
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await waiting
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        await pipe.aclose()
        await asyncio.sleep(0.05)
        gc.collect()
    assert pipe._protocol is None and pipe._connecting is None


async def test_a_caller_cancelled_as_its_connect_ends_leaves_the_connection_to_the_pipe(
    redis_url: str,
) -> None:
    """The connect ends, and the caller waiting on it is cancelled before it resumes (a service
    stopping at that moment): the pipe keeps the connection it made, so `aclose()` closes it (this
    left a socket to Redis open until pytest's exit, failing CI)."""
    for _ in range(20):
        pipe = ScriptPipe(redis_url)
        waiting = asyncio.ensure_future(pipe.execute("PING"))
        # one loop step at a time, so the cancel lands exactly between the connect and the resume
        while pipe._connecting is None:  # noqa: ASYNC110
            await asyncio.sleep(0)
        connecting = pipe._connecting
        while not connecting.done():  # noqa: ASYNC110
            await asyncio.sleep(0)
        waiting.cancel()  # the connect is done; the caller has not resumed yet, or has just
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        await pipe.aclose()
        transport = connecting.result().transport
        assert transport is None or transport.is_closing()
