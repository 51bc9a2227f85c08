"""Where `http.fetch` may connect: the name is resolved here, every address it resolves to is
checked, and the connection goes to an address that passed (no second lookup by the socket layer,
so a DNS answer that changes between check and connect cannot lead elsewhere).

A non-global address (loopback, private, link-local, CGNAT, the metadata address, unique-local,
IPv4-mapped or -translated forms of any of these) is refused for a name. An IP literal reaches
this point only when the allow-list lists that very literal, and `localhost` only when the list
names `localhost`: both are connected to as the operator asked.

It is an httpcore network backend (the layer httpx connects through), so TLS still verifies the
certificate against the name and connections are pooled per name as before.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from httpcore import AsyncNetworkStream, ConnectError
from httpcore._backends.auto import AutoBackend
from httpcore._backends.base import SOCKET_OPTION, AsyncNetworkBackend
from toolbus_contracts.errors import HostNotAllowed

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""Resolves a host name and port to IP address strings (the default asks the system)."""

_NOT_GLOBAL_V4 = (ipaddress.ip_network("100.64.0.0/10"), ipaddress.ip_network("0.0.0.0/8"))


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def is_public(address: str) -> bool:
    """True for a globally routable unicast address; False for every special-purpose one, and
    for IPv4-mapped (`::ffff:127.0.0.1`), NAT64/6to4/Teredo forms of a non-global IPv4."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is None and ip in ipaddress.ip_network("64:ff9b::/96"):
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            return is_public(str(embedded))
    if isinstance(ip, ipaddress.IPv4Address) and any(ip in net for net in _NOT_GLOBAL_V4):
        return False
    return ip.is_global and not ip.is_multicast


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


class GuardedBackend(AsyncNetworkBackend):
    """Resolves, checks, then connects to the checked address."""

    def __init__(self, resolver: Resolver | None = None) -> None:
        self._resolver = resolver or system_resolver
        self._inner = AutoBackend()

    async def addresses(self, host: str, port: int) -> list[str]:
        """The addresses a connection to `host` may use, or `HostNotAllowed`."""
        if _is_literal(host):
            return [host.strip("[]")]
        try:
            found = await self._resolver(host, port)
        except (OSError, UnicodeError) as exc:
            raise ConnectError(f"cannot resolve the host: {type(exc).__name__}") from None
        if host == "localhost":
            return found
        allowed = [a for a in found if is_public(a)]
        if not allowed:
            raise HostNotAllowed(
                f"Host '{host}' resolves to an address that is not public (loopback, private, "
                "link-local or another special range); only an IP literal or 'localhost' on the "
                "allow-list may lead there.",
                details={"host": host},
            )
        return allowed

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's signature
        local_address: str | None = None,
        socket_options: Iterable[SOCKET_OPTION] | None = None,
    ) -> AsyncNetworkStream:
        last: Exception | None = None
        for address in await self.addresses(host, port):
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except (ConnectError, OSError) as exc:
                last = exc
        raise ConnectError(f"could not connect: {type(last).__name__}") from None

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> AsyncNetworkStream:
        raise ConnectError("unix sockets are not reachable through http.fetch")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)
