"""The fault tests' Redis proxy leaves nothing open once stopped, even a connection it was still
making upstream when `stop` came (a socket to Redis found unclosed at pytest's exit failed CI)."""

from __future__ import annotations

import asyncio

from tests.support.cutting_proxy import CuttingProxy


async def test_stop_while_a_client_is_being_connected_upstream_leaves_no_connection() -> None:
    upstream: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def accept(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        upstream.append((r, w))

    target = await asyncio.start_server(accept, "127.0.0.1", 0)
    proxy = await CuttingProxy("127.0.0.1", target.sockets[0].getsockname()[1]).start()
    try:
        clients = [await asyncio.open_connection("127.0.0.1", proxy.port) for _ in range(8)]
        await asyncio.sleep(0)  # the handlers start; their upstream connects are under way
        await proxy.stop()
        await asyncio.sleep(0.2)  # a connect that outlived `stop` would have finished by now
        assert not proxy._writers and not proxy._handlers
        for r, _ in upstream:  # every upstream connection the proxy made is closed from its side
            assert await asyncio.wait_for(r.read(), 2) == b""
        for r, w in clients:
            assert await asyncio.wait_for(r.read(), 2) == b""
            w.close()
    finally:
        for _, w in upstream:
            w.close()
        target.close()
        await target.wait_closed()
