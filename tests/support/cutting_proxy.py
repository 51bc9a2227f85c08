"""A TCP proxy in front of a real Redis that loses one reply on purpose.

`arm(marker)`: the next command carrying `marker` (e.g. a Lua script's SHA1) is passed on to
Redis, which runs it; when Redis answers, the proxy drops that answer and closes the connection
on both sides, so the client sees its connection break with the command in flight and cannot
tell whether it ran. `arm(marker, stall=True)`: the answer is dropped and the connection left
open, silent (a peer that vanished without a reset). Every other byte is passed through unchanged.
`down()`: Redis is away: every open connection is reset and new ones are accepted and reset at
once (counted in `refused`) until `up()`. `silence()`: Redis goes silent, as a peer behind a dead
link does: commands still reach it, but no answer comes back on any connection, open or new, and
no connection is closed; `speak()` ends it: the connections that lost answers are reset (their
byte stream has a hole), new ones work again. `silence(deaf=True)`: a link dead both ways, the
commands are lost too (never reach Redis; those connections are reset by `speak()` as well).

    proxy = await CuttingProxy("127.0.0.1", 6379).start()   # or: async with proxy_to(redis_url)
    proxy.url                      # redis://127.0.0.1:<port>
    proxy.arm(sha.encode())
    ...
    proxy.cuts                     # how many answers it dropped
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit


class CuttingProxy:
    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._marker: bytes | None = None
        self._stall = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        """The connection handlers `start_server` runs (`_serve`): stopped with the proxy, so one
        still connecting upstream cannot open a connection to Redis after `stop`."""
        self._stopped = False
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0
        self.cuts = 0
        self.refused = 0
        self._down = False
        self._silent = False
        self._deaf = False
        self.swallowed = 0
        """Answers (reads from Redis) swallowed while silent."""
        self.lost_commands = 0
        """Commands (reads from clients) lost while deaf."""
        self._holed: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def arm(self, marker: bytes, *, stall: bool = False) -> None:
        """Lose the answer to the next command that carries `marker` (and close, or stall)."""
        self._marker = marker
        self._stall = stall

    def down(self) -> None:
        """Reset every connection and refuse new ones until `up()`."""
        self._down = True
        for writer in list(self._writers):
            if writer.transport is not None:
                writer.transport.abort()

    def up(self) -> None:
        self._down = False

    def silence(self, *, deaf: bool = False) -> None:
        """No answer reaches any client, on open or new connections, until `speak()`; `deaf`: no
        command reaches Redis either."""
        self._silent = True
        self._deaf = deaf

    def speak(self) -> None:
        """Answers (and commands) flow again; each connection that lost some while silent is reset."""
        self._silent = False
        self._deaf = False
        for writer in list(self._holed):
            if writer.transport is not None:
                writer.transport.abort()
        self._holed.clear()

    async def start(self) -> CuttingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        self._stopped = True
        if self._server is not None:
            self._server.close()
        for handler in list(self._handlers):
            handler.cancel()
        for handler in list(self._handlers):
            with contextlib.suppress(BaseException):
                await handler
        for writer in list(self._writers):
            if writer.transport is not None:
                writer.transport.abort()  # at once, both sides: nothing is left open at the end
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        await asyncio.sleep(0)  # the aborted transports close their sockets on the next loop turn

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        try:
            await self._relay(client_r, client_w)
        finally:
            self._handlers.discard(handler)

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self._down or self._stopped:
            self.refused += 1
            client_w.transport.abort()
            return
        try:
            server_r, server_w = await asyncio.open_connection(*self._target)
        except OSError:
            client_w.close()
            return
        except asyncio.CancelledError:  # stopped while connecting upstream
            client_w.transport.abort()
            raise
        if self._stopped:  # stopped as the upstream connection was made: nothing may stay open
            client_w.transport.abort()
            server_w.transport.abort()
            return
        self._writers.update((client_w, server_w))
        doomed = asyncio.Event()  # set once this connection carried the armed command
        stall = False

        def cut() -> None:
            for writer in (client_w, server_w):
                if writer.transport is not None:
                    writer.transport.abort()

        async def upstream() -> None:
            nonlocal stall
            while data := await client_r.read(65536):
                if self._silent and self._deaf:
                    self.lost_commands += 1
                    self._holed.update((client_w, server_w))
                    continue
                marker = self._marker
                if marker is not None and marker in data:
                    self._marker = None
                    stall = self._stall
                    doomed.set()
                server_w.write(data)
                await server_w.drain()

        async def downstream() -> None:
            while data := await server_r.read(65536):
                if self._silent:
                    self.swallowed += 1
                    self._holed.update((client_w, server_w))
                    continue
                if client_w in self._holed:  # a hole in this stream: nothing after it can be sent
                    return
                if doomed.is_set():
                    self.cuts += 1
                    if stall:  # swallow everything from now on, keep the connection open
                        while await server_r.read(65536):
                            pass
                    cut()
                    return
                client_w.write(data)
                await client_w.drain()

        tasks = [asyncio.create_task(upstream()), asyncio.create_task(downstream())]
        self._tasks.update(tasks)
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            pass
        finally:
            cut()
            for task in tasks:
                task.cancel()
                self._tasks.discard(task)
            self._writers.discard(client_w)
            self._writers.discard(server_w)
            self._holed.discard(client_w)
            self._holed.discard(server_w)


@contextlib.asynccontextmanager
async def proxy_to(redis_url: str) -> AsyncIterator[CuttingProxy]:
    """A started proxy in front of the Redis at `redis_url` (host and port; the caller keeps the
    URL's db); at the end it speaks again and is stopped, every connection through it closed."""
    parts = urlsplit(redis_url)
    proxy = await CuttingProxy(parts.hostname or "127.0.0.1", parts.port or 6379).start()
    try:
        yield proxy
    finally:
        proxy.speak()
        await proxy.stop()
