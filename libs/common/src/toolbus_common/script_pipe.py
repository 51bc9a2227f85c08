"""One Redis connection for hot-path Lua scripts: each EVALSHA is written the moment it is made
and its reply is matched in order (Redis answers a connection's commands in the order sent).
`execute` sends any other command the same way (the event relay's `XREAD BLOCK` and `XDEL`, on a
pipe of the relay's own: a blocking command holds up everything behind it on its connection).

Why not redis-py's asyncio client here: measured in the dispatcher, a script call through it
costs ~260 µs where Redis itself spends ~60 µs and the loopback round trip ~40 µs; the rest is
the client's per-command pool checkout, retry wrapper and task hops. This pipe costs one write
and a hiredis parse: many concurrent calls share the connection and pipeline naturally.

Commands made in one event-loop turn leave in one write. It does nothing else: no retries (a script whose connection broke mid-flight may or may not have
run; the caller decides), reconnect on the next call, and a `NOSCRIPT` reply is returned as
`NoScript` so the caller can load the script (with redis-py) and run it again.

A connection that stops answering without closing (a Redis host that vanished with no reset, a
stalled network: the kernel would only notice after TCP keepalive's two hours) is closed once
commands have waited `reply_timeout` seconds (default 10) with no byte of reply: its commands fail
with `PipeConnectionError`, as if it had broken, and the caller's retry goes out on a new one. One
timer per pipe, armed while commands wait, checks every quarter of the timeout.

Production settings: `rediss://` (or an `ssl` context) speaks TLS; a password and user come from
the URL or the arguments; `locate` (an async function giving the master's host and port, e.g.
`SentinelConnectionPool.get_master_address`) is asked on every (re)connect, so after a Sentinel
failover the next call reaches the new master. A `READONLY` reply (the server this connection
reached was demoted to a replica) closes the connection and is raised as `PipeConnectionError`:
the next call locates the master again. Redis refuses the write before running it, so nothing
was changed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl as ssl_module
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote, urlsplit

import hiredis


class ScriptReplyError(Exception):
    """Redis answered this command with an error reply."""


class NoScript(ScriptReplyError):
    """Redis does not have the script (restarted, or `SCRIPT FLUSH`): load it and call again."""


class PipeConnectionError(ConnectionError):
    """The connection failed; commands in flight may or may not have run."""


def _encode(args: tuple[bytes | str | int | float, ...]) -> bytes:
    """RESP encoding by hiredis (C): a fifth of the Python loop it replaced, same bytes."""
    packed: bytes = hiredis.pack_command(args)  # type: ignore[arg-type]  # its stub: a 1-tuple
    return packed


class _Protocol(asyncio.Protocol):
    def __init__(self, pending: collections.deque[asyncio.Future[Any]]) -> None:
        self._pending = pending
        self._reader = hiredis.Reader(replyError=ScriptReplyError)
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.closed = self.loop.create_future()
        self.progress = self.loop.time()
        """When a byte of reply last came, or commands began to wait on an idle connection."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport; they have the same methods.
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.progress = self.loop.time()
        self._reader.feed(data)
        while (reply := self._reader.gets()) is not False:
            future = self._pending.popleft()
            if future.done():
                continue
            if isinstance(reply, ScriptReplyError):
                text = str(reply)
                if text.startswith("READONLY"):
                    # A failover demoted this server: nothing ran; reconnect to the new master.
                    future.set_exception(PipeConnectionError("the Redis server became a replica (failover)"))
                    if self.transport is not None:
                        self.transport.close()
                    continue
                future.set_exception(NoScript(text) if text.startswith("NOSCRIPT") else reply)
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        while self._pending:
            future = self._pending.popleft()
            if not future.done():
                future.set_exception(
                    PipeConnectionError("the Redis connection closed with this command in flight")
                )
        if not self.closed.done():
            self.closed.set_result(None)


class ScriptPipe:
    """`await pipe.evalsha(sha, keys, args)`; connects on first use and after a failure."""

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float = 5.0,
        username: str | None = None,
        password: str | None = None,
        ssl: ssl_module.SSLContext | None = None,
        locate: Callable[[], Awaitable[tuple[str, int]]] | None = None,
        reply_timeout: float | None = 10.0,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", ""):
            raise ValueError("ScriptPipe speaks redis:// and rediss:// only")
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 6379
        self._db = int(parts.path.lstrip("/") or 0)
        self._username = username or (unquote(parts.username) if parts.username else None)
        self._password = password or (unquote(parts.password) if parts.password else None)
        if ssl is None and parts.scheme == "rediss":
            ssl = ssl_module.create_default_context()
        self._ssl = ssl
        self._locate = locate
        self._timeout = connect_timeout
        self._pending: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._outgoing: list[bytes] = []
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Future[_Protocol] | None = None
        self.reply_timeout = reply_timeout
        self._watch: asyncio.TimerHandle | None = None
        self._watched: _Protocol | None = None

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        self._pending = collections.deque()
        self._outgoing = []
        pending = self._pending
        try:
            async with asyncio.timeout(self._timeout):
                if self._locate is not None:
                    self._host, self._port = await self._locate()
                _, protocol = await loop.create_connection(
                    lambda: _Protocol(pending),
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                )
        except (OSError, TimeoutError) as exc:
            raise PipeConnectionError(f"cannot reach Redis at {self._host}:{self._port}") from exc
        except Exception as exc:  # the locator's own errors (no Sentinel answered, no master known)
            raise PipeConnectionError(f"cannot locate the Redis master ({type(exc).__name__})") from exc
        setup: list[tuple[bytes | str | int | float, ...]] = []
        if self._password is not None:
            setup.append(
                ("AUTH", self._username, self._password) if self._username else ("AUTH", self._password)
            )
        if self._db:
            setup.append(("SELECT", self._db))
        try:
            for command in setup:
                await self._send(protocol, command)
        except BaseException as exc:
            # Refused, lost or cancelled during the setup: the connection is nobody's, so close it.
            if protocol.transport is not None:
                protocol.transport.close()
            if not isinstance(exc, ScriptReplyError):
                raise
            # The reply names no secret (WRONGPASS / NOAUTH); the password is never in the text.
            raise PipeConnectionError(
                f"Redis refused the connection setup: {str(exc).split(' ')[0]}"
            ) from exc
        return protocol

    def _send(
        self, protocol: _Protocol, command: tuple[bytes | str | int | float, ...]
    ) -> asyncio.Future[Any]:
        """Queue the command; everything queued in one event-loop turn leaves in one write."""
        loop = protocol.loop
        future: asyncio.Future[Any] = loop.create_future()
        if not self._pending:
            protocol.progress = loop.time()  # an idle connection: the wait starts now
        self._pending.append(future)
        self._watched = protocol
        if self._watch is None and self.reply_timeout is not None:
            self._watch = loop.call_later(self.reply_timeout / 4, self._check)
        if not self._outgoing:
            loop.call_soon(self._flush, protocol)
        self._outgoing.append(_encode(command))
        return future

    def _check(self) -> None:
        """Close the connection last sent on if its waiting commands got no byte of reply for
        `reply_timeout`; look again in a quarter of it while commands wait."""
        self._watch = None
        protocol, timeout = self._watched, self.reply_timeout
        if protocol is None or timeout is None or protocol.transport is None:
            return
        if protocol.transport.is_closing() or not self._pending:
            return  # the next command arms the timer again
        if protocol.loop.time() - protocol.progress > timeout:
            protocol.transport.abort()  # connection_lost fails what waits: PipeConnectionError
            return
        self._watch = protocol.loop.call_later(timeout / 4, self._check)

    def _flush(self, protocol: _Protocol) -> None:
        data, self._outgoing = b"".join(self._outgoing), []
        if protocol.transport is not None and not protocol.transport.is_closing():
            protocol.transport.write(data)
        # else: connection_lost has failed (or will fail) the futures of these commands.

    async def _live(self) -> _Protocol:
        protocol = self._protocol
        if protocol is not None and protocol.transport is not None and not protocol.transport.is_closing():
            return protocol
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
            self._connecting.add_done_callback(self._connected)
        return await asyncio.shield(self._connecting)

    def _connected(self, connecting: asyncio.Future[_Protocol]) -> None:
        """The pipe takes the connection it made as the connect ends, before any caller resumes:
        a caller cancelled at that moment would otherwise drop it, open and nobody's (aclose would
        not find it)."""
        if self._connecting is not connecting:
            return  # taken over by aclose, which closes what it made
        self._connecting = None
        if not connecting.cancelled() and connecting.exception() is None:
            self._protocol = connecting.result()

    async def evalsha(self, sha: str, keys: list[str], args: list[Any]) -> Any:
        """Run a loaded script; raises `NoScript`, `ScriptReplyError` or `PipeConnectionError`."""
        protocol = self._protocol
        if protocol is None or protocol.transport is None or protocol.transport.is_closing():
            protocol = await self._live()
        return await self._send(protocol, ("EVALSHA", sha, len(keys), *keys, *args))

    async def execute(self, *command: bytes | str | int | float) -> Any:
        """Any other command (the event relay's XREAD and XDEL), raw hiredis reply; the same errors
        as `evalsha`. A blocking command (`XREAD BLOCK`) holds up every command after it on this
        connection: give it a pipe of its own."""
        protocol = self._protocol
        if protocol is None or protocol.transport is None or protocol.transport.is_closing():
            protocol = await self._live()
        return await self._send(protocol, command)

    async def aclose(self) -> None:
        """Close the connection, and one still being made (a caller cancelled while it waited for
        the connect leaves it running, shielded: it would open a connection nobody closes)."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        protocols = [self._protocol]
        self._protocol = None
        connecting, self._connecting = self._connecting, None
        if connecting is not None:
            connecting.cancel()  # a connect that already finished keeps its result
            with contextlib.suppress(BaseException):  # cancelled or failed: it left no connection open
                protocols.append(await connecting)
        for protocol in protocols:
            if protocol is not None and protocol.transport is not None:
                protocol.transport.close()
                await protocol.closed
