"""Connections shared by everything in a process, keyed by server URL, name and credential headers."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import OrderedDict

from toolbus_mcp_client._connection import McpConnection, Mode
from toolbus_mcp_client._egress import EgressCheck

PoolKey = tuple[str, str, tuple[tuple[str, str], ...]]


def _key(url: str, headers: dict[str, str], server_name: str) -> PoolKey:
    return (url, server_name, tuple(sorted(headers.items())))


class McpPool:
    """A bounded LRU of open `McpConnection`s.

    `get` on a connection that is already open is a dict lookup (no lock, no await that
    suspends). Concurrent first callers for one key share one opening; a failed opening is not
    remembered, so the next `get` tries again. An evicted connection closes once its calls in
    flight finish (or after `evict_grace` seconds). `aclose` closes everything, newest first.
    """

    def __init__(
        self,
        *,
        max_size: int = 256,
        open_timeout: float = 30.0,
        evict_grace: float = 60.0,
        mode: Mode = "auto",
        max_body: int | None = None,
        egress: EgressCheck | None = None,
    ) -> None:
        """`max_body`: the longest tool answer read, in bytes (`OutputTooLarge` past it);
        `egress`: where connections may go (`McpConnection.open`; None: anywhere)."""
        if max_size < 1:
            raise ValueError("max_size must be at least 1")
        self.max_size = max_size
        self._open_timeout = open_timeout
        self._evict_grace = evict_grace
        self._mode: Mode = mode
        self._max_body = max_body
        self._egress = egress
        self._conns: OrderedDict[PoolKey, McpConnection] = OrderedDict()
        self._opening: dict[PoolKey, asyncio.Task[McpConnection]] = {}
        self._order: dict[McpConnection, int] = {}
        self._seq = itertools.count()
        self._closing: dict[asyncio.Task[None], McpConnection] = {}
        self._closed = False

    def __len__(self) -> int:
        return len(self._conns)

    async def get(self, url: str, headers: dict[str, str], *, server_name: str) -> McpConnection:
        """The open connection for this server and these headers, opened on first use.

        Raises what `McpConnection.open` raises when the server can't be connected to.
        """
        key = _key(url, headers, server_name)
        conn = self._conns.get(key)
        if conn is not None and not conn.closed:
            self._conns.move_to_end(key)
            return conn
        return await self._open(key, url, headers, server_name)

    async def _open(self, key: PoolKey, url: str, headers: dict[str, str], server_name: str) -> McpConnection:
        if self._closed:
            raise RuntimeError("the MCP connection pool is closed")
        task = self._opening.get(key)
        if task is None:
            task = asyncio.create_task(
                McpConnection.open(
                    url,
                    headers,
                    server_name=server_name,
                    mode=self._mode,
                    timeout=self._open_timeout,
                    max_body=self._max_body,
                    egress=self._egress,
                )
            )
            self._opening[key] = task
            task.add_done_callback(lambda t: self._opened(key, t))
        # shield: one caller giving up must not cancel the opening the others wait for.
        return await asyncio.shield(task)

    def _opened(self, key: PoolKey, task: asyncio.Task[McpConnection]) -> None:
        if self._opening.get(key) is task:
            del self._opening[key]
        if task.cancelled() or task.exception() is not None:
            return
        conn = task.result()
        if self._closed:
            self._close_later(conn, grace=0.0)
            return
        old = self._conns.pop(key, None)
        if old is not None and old is not conn:
            self._close_later(old, grace=self._evict_grace)
        self._conns[key] = conn
        self._order[conn] = next(self._seq)
        while len(self._conns) > self.max_size:
            _, evicted = self._conns.popitem(last=False)
            self._close_later(evicted, grace=self._evict_grace)

    def _close_later(self, conn: McpConnection, *, grace: float) -> None:
        self._order.pop(conn, None)
        task = asyncio.create_task(conn.aclose(grace=grace))
        self._closing[task] = conn
        task.add_done_callback(lambda t: self._closing.pop(t, None))

    async def discard(self, url: str, headers: dict[str, str], *, server_name: str) -> None:
        """Drop and close this key's connection (after its calls in flight), if there is one."""
        conn = self._conns.pop(_key(url, headers, server_name), None)
        if conn is not None:
            self._close_later(conn, grace=self._evict_grace)

    async def aclose(self) -> None:
        """Close every connection, the most recently created first; later `get`s fail."""
        self._closed = True
        for task in list(self._opening.values()):
            with contextlib.suppress(BaseException):
                await task
        conns = sorted(self._conns.values(), key=lambda c: self._order.get(c, -1), reverse=True)
        self._conns.clear()
        self._order.clear()
        for conn in conns:
            await conn.aclose()
        for closing, conn in list(self._closing.items()):
            conn.cut_grace()
            with contextlib.suppress(BaseException):
                await closing
