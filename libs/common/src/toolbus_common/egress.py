"""The operator's egress policy: which addresses toolbus may connect to at all, for `http.fetch`
and for MCP servers, whatever a toolset lists.

By default only globally routable unicast addresses: loopback, private, link-local (the cloud
metadata address 169.254.169.254 among them), unique-local (`fd00:ec2::254`), CGNAT, reserved,
documentation, multicast and unspecified ranges are refused, and so is every IPv6 form that
carries an IPv4 address (IPv4-mapped `::ffff:a.b.c.d`, `::ffff:0:a.b.c.d`, IPv4-compatible
`::a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`), which is judged by the IPv4 address it
carries; Teredo and local-use NAT64 (`64:ff9b:1::/48`) are refused outright. The deployment
widens this with `TOOLBUS_EGRESS_ALLOW`: a comma-separated list of networks (`10.0.0.0/8`),
addresses (`::1`) and host names (`mcp.corp.internal`, `*.svc.cluster.local`), whose addresses
are then allowed whatever they resolve to.

A name is resolved here and every address it gives is checked; the caller connects to an address
that passed (`EgressPolicy.addresses`), so a DNS answer that changes between check and connect
cannot lead elsewhere. A refusal is decided before any connection: it says nothing about whether
something listens there.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from toolbus_contracts.errors import HostNotAllowed

T = TypeVar("T")
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""Resolves a host name and port to IP address strings (the default asks the system)."""

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_TEREDO = ipaddress.ip_network("2001::/32")
_CGNAT = ipaddress.ip_network("100.64.0.0/10")  # not global; older Pythons do not all say so
_ALWAYS_LOOPBACK = ("localhost", ".localhost")  # RFC 6761: these names are this machine


class EgressRefused(Exception):
    """A host or address the egress policy does not allow (raised before any connection)."""


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries and leads to: IPv4-mapped (`::ffff:0:0/96`),
    IPv4-translated (`::ffff:0:0:0/96`), IPv4-compatible (`::/96`), NAT64 (`64:ff9b::/96`) or 6to4
    (`2002::/16`); None for any other address."""
    value = int(ip)
    high = value >> 32
    if high in (0xFFFF, 0xFFFF_0000, 0) or ip in _NAT64:
        return ipaddress.IPv4Address(value & 0xFFFF_FFFF)
    return ip.sixtofour


@functools.lru_cache(maxsize=4096)  # the stdlib's checks walk lists of networks: ~30 us a call
def is_public(ip: IPAddress) -> bool:
    """True for a globally routable unicast address (an IPv6 form carrying an IPv4 address is
    judged by that address); False for every special-purpose one."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:
            return False
        inner = embedded_ipv4(ip)
        if inner is not None:
            return is_public(inner)
        if ip in _TEREDO or ip in _NAT64_LOCAL or ip.is_site_local:
            return False
    elif ip in _CGNAT:
        return False
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_unspecified)


def parse_address(text: str) -> IPAddress | None:
    """The address an IP literal (IPv6 in brackets or not, with a `%zone` or not) spells, or None."""
    text = text.strip().strip("[]")
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _host_name(text: str) -> str:
    return text.strip().lower().rstrip(".")


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """Public addresses, plus what the operator allows: `networks` (addresses are /32 or /128)
    and `names` (exact, or `*.suffix` for any subdomain)."""

    networks: tuple[IPNetwork, ...] = ()
    names: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str | Iterable[str]) -> EgressPolicy:
        """The policy of a `TOOLBUS_EGRESS_ALLOW` value (comma-separated, or a list of entries);
        raises ValueError naming an entry that is no network, address or host name."""
        entries = text.split(",") if isinstance(text, str) else list(text)
        networks: list[IPNetwork] = []
        names: set[str] = set()
        suffixes: set[str] = set()
        for raw in entries:
            entry = raw.strip()
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            name = _host_name(entry)
            label = name.removeprefix("*.")
            if not label or "/" in label or ":" in label or "*" in label or " " in label:
                raise ValueError(f"TOOLBUS_EGRESS_ALLOW: {entry!r} is not a network, address or host name")
            if name.startswith("*."):
                suffixes.add("." + label)
            else:
                names.add(name)
        return cls(tuple(networks), frozenset(names), tuple(sorted(suffixes)))

    def allows_address(self, address: IPAddress | str) -> bool:
        """True where toolbus may connect to this address."""
        ip = parse_address(address) if isinstance(address, str) else address
        if ip is None:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
            ip = ipaddress.IPv6Address(str(ip).split("%", 1)[0])
        if is_public(ip) or self._listed(ip):
            return True
        inner = embedded_ipv4(ip) if isinstance(ip, ipaddress.IPv6Address) else None
        return inner is not None and self._listed(inner)

    def _listed(self, ip: IPAddress) -> bool:
        return any(ip.version == net.version and ip in net for net in self.networks)

    def allows_name(self, host: str) -> bool:
        """True where the operator allows this host name whatever it resolves to."""
        name = _host_name(host)
        return name in self.names or any(name.endswith(s) and len(name) > len(s) for s in self.suffixes)

    def static_refusal(self, host: str) -> str | None:
        """Why a host given at registration (a URL's host, an allow entry's, `*.` wildcards too)
        is refused without resolving it, or None: an IP literal the policy does not allow, or a
        `localhost` name (always this machine) the operator did not allow by name. Other names
        are checked when connecting, as they resolve then."""
        ip = parse_address(host)
        if ip is not None:
            if self.allows_address(ip):
                return None
            return f"'{ip.compressed}' is an address the deployment's egress policy does not allow"
        name = _host_name(host)
        if self.allows_name(name):
            return None
        bare = name.removeprefix("*.")
        if bare == _ALWAYS_LOOPBACK[0] or bare.endswith(_ALWAYS_LOOPBACK[1]):
            return f"'{name}' is this machine (loopback), which the deployment's egress policy does not allow"
        return None

    async def addresses(self, host: str, port: int, resolver: Resolver | None = None) -> list[str]:
        """The addresses a connection to `host` may use, in the resolver's order; `EgressRefused`
        when none may (before connecting), `OSError` when the name does not resolve."""
        literal = parse_address(host)
        if literal is not None:
            if not self.allows_address(literal):
                raise EgressRefused(
                    f"'{literal.compressed}' is an address the deployment's egress policy does not allow "
                    "(loopback, private, link-local, metadata or another special range)."
                )
            return [str(literal)]
        found = await (resolver or system_resolver)(host, port)
        if self.allows_name(host):
            return found
        allowed = [a for a in found if self.allows_address(a)]
        if not allowed:
            raise EgressRefused(
                f"'{_host_name(host)}' resolves only to addresses the deployment's egress policy does not "
                "allow (loopback, private, link-local, metadata or another special range)."
            )
        return allowed

    def checker(self, resolver: Resolver | None = None) -> Resolver:
        """`addresses` as one callable (what `toolbus_mcp_client` takes): `HostNotAllowed` naming
        the host where the policy refuses it."""

        async def check(host: str, port: int) -> list[str]:
            try:
                return await self.addresses(host, port, resolver)
            except EgressRefused as exc:
                raise HostNotAllowed(str(exc), details={"host": _host_name(host).strip("[]")}) from None

        return check


async def connect_first(
    addresses: Iterable[str],
    connect: Callable[[str], Awaitable[T]],
    errors: tuple[type[Exception], ...] = (OSError,),
) -> T:
    """`connect(address)` for each checked address in turn until one answers: the one connect
    loop of every egress-checked connection (httpx's and httpx2's network backends, the MCP
    client's lean pool). Raises the last of `errors` when none answers, `OSError` when there was
    no address at all."""
    last: Exception | None = None
    for address in addresses:
        try:
            return await connect(address)
        except errors as exc:
            last = exc
    raise last or OSError("no address to connect to")
