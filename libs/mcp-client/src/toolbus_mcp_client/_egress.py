"""Where an MCP connection may go: every TCP connection (httpx2's and the lean pool's) asks the
deployment's egress check for the addresses of its host and connects to one of those, never
resolving the name again, so a DNS answer that changes between check and connect cannot lead
elsewhere. The check itself (`toolbus_common.egress.EgressPolicy.checker`) is given by the
service; without one (`None`) connections go wherever the URL says.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import httpx2
from httpcore2 import AsyncNetworkStream, ConnectError
from httpcore2._backends.auto import AutoBackend
from httpcore2._backends.base import AsyncNetworkBackend
from httpcore2._types import SOCKET_OPTION
from toolbus_common.egress import connect_first
from toolbus_contracts.errors import HostNotAllowed

EgressCheck = Callable[[str, int], Awaitable[list[str]]]
"""The addresses a connection to `host`:`port` may use; raises `HostNotAllowed` where the
deployment's egress policy refuses the host (before any connection), `OSError` where it does not
resolve."""


P = TypeVar("P", bound=asyncio.Protocol)


class EgressBlocked(OSError):
    """A connection the egress policy refused (the lean pool reports it as a connect failure)."""


async def allowed_addresses(check: EgressCheck, host: str, port: int) -> list[str]:
    """`check`'s addresses, with a refusal as `EgressBlocked` (an `OSError`, as a failed connect is)."""
    try:
        return await check(host, port)
    except HostNotAllowed as exc:
        raise EgressBlocked(exc.message) from None


class GuardedBackend(AsyncNetworkBackend):
    """httpcore2's network backend with the egress check in front: it connects to checked addresses."""

    def __init__(self, check: EgressCheck) -> None:
        self._check = check
        self._inner = AutoBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore2's signature
        local_address: str | None = None,
        socket_options: Iterable[SOCKET_OPTION] | None = None,
    ) -> AsyncNetworkStream:
        try:
            addresses = await allowed_addresses(self._check, host, port)
        except EgressBlocked as exc:
            raise ConnectError(f"refused by the egress policy: {exc}") from None
        except OSError as exc:
            raise ConnectError(f"cannot resolve the host: {type(exc).__name__}") from None
        try:
            return await connect_first(
                addresses,
                lambda address: self._inner.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                ),
                (ConnectError, OSError),
            )
        except (ConnectError, OSError) as exc:
            raise ConnectError(f"could not connect: {type(exc).__name__}") from None

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> AsyncNetworkStream:
        raise ConnectError("unix sockets are not MCP servers")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def guard_transport(transport: httpx2.AsyncHTTPTransport, check: EgressCheck | None) -> None:
    """Put the egress check in front of `transport`'s connections (httpx2 takes no backend
    argument: its pool's is the one place to check addresses at connect time)."""
    if check is not None:
        transport._pool._network_backend = GuardedBackend(check)


async def open_checked(
    check: EgressCheck | None,
    factory: Callable[[], P],
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
) -> P:
    """`loop.create_connection` for the lean pool: to `host` as given without a check, else to
    the first checked address that answers (TLS still verified against `host`)."""
    loop = asyncio.get_running_loop()
    server_hostname = host if ssl_context is not None else None
    if check is None:
        _, proto = await loop.create_connection(
            factory, host, port, ssl=ssl_context, server_hostname=server_hostname
        )
        return proto

    async def connect(address: str) -> P:
        _, proto = await loop.create_connection(
            factory, address, port, ssl=ssl_context, server_hostname=server_hostname
        )
        return proto

    return await connect_first(await allowed_addresses(check, host, port), connect)
