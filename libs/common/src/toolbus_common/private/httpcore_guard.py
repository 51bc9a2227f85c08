"""Where `http.fetch` and the credentials service's OAuth requests may connect: the name is resolved here, every address it resolves to is
checked against the deployment's egress policy (`toolbus_common.egress`), and the connection goes
to an address that passed (no second lookup by the socket layer, so a DNS answer that changes
between check and connect cannot lead elsewhere).

The policy applies to every host, IP literals and `localhost` included: a toolset's allow-list
only narrows what the operator allows, it never widens it. A refusal is decided before any
connection, so it is the same whether or not something listens there.

It is an httpcore network backend (the layer httpx connects through), so TLS still verifies the
certificate against the name and connections are pooled per name as before. httpx takes no
network backend argument: `guard_transport` sets its pool's (`_pool._network_backend`, httpx
0.28.1 / httpcore 1.0.9), the one place to check addresses at connect time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx
from httpcore import AsyncNetworkStream, ConnectError
from httpcore._backends.auto import AutoBackend
from httpcore._backends.base import SOCKET_OPTION, AsyncNetworkBackend
from toolbus_contracts.errors import HostNotAllowed

from toolbus_common.egress import EgressPolicy, EgressRefused, Resolver, connect_first

__all__ = ["GuardedBackend", "Resolver", "guard_transport"]


class GuardedBackend(AsyncNetworkBackend):
    """Resolves, checks, then connects to the checked address."""

    def __init__(self, policy: EgressPolicy, resolver: Resolver | None = None) -> None:
        self._policy = policy
        self._resolver = resolver
        self._inner = AutoBackend()

    async def addresses(self, host: str, port: int) -> list[str]:
        """The addresses a connection to `host` may use, or `HostNotAllowed`."""
        try:
            return await self._policy.addresses(host.strip("[]"), port, self._resolver)
        except EgressRefused as exc:
            raise HostNotAllowed(
                f"Host '{host.strip('[]')}' is refused: {exc}", details={"host": host.strip("[]")}
            ) from None
        except (OSError, UnicodeError) as exc:
            raise ConnectError(f"cannot resolve the host: {type(exc).__name__}") from None

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's signature
        local_address: str | None = None,
        socket_options: Iterable[SOCKET_OPTION] | None = None,
    ) -> AsyncNetworkStream:
        addresses = await self.addresses(host, port)
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
        raise ConnectError("unix sockets are not reachable through an egress-checked client")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def guard_transport(transport: httpx.AsyncHTTPTransport, backend: AsyncNetworkBackend) -> None:
    """Make `transport` connect through `backend` (its pool's private network backend)."""
    transport._pool._network_backend = backend
