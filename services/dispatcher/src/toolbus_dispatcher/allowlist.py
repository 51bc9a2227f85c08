"""The http tool's allow-list: which hosts a URL may reach.

A URL passes only when its scheme is http or https, it carries no userinfo, and its host, after
lower-casing, IDNA encoding and dropping one trailing dot, is an exact entry, a subdomain of a
`*.example.com` entry (not `example.com` itself), or an IP literal listed literally; an entry
with `:port` allows that port only (80 or 443 where the URL gives none), one without any port. A host that a
URL parser reads as an IPv4 address (`2130706433`, `127.1`, `0x7f.0.0.1`: WHATWG's forms) is that
address, so it matches only the dotted-quad literal. Everything else raises `HostNotAllowed`
naming the host, as does a URL that does not parse or that httpx would not send (a control
character, a bad port, over 64 KiB). Where the name then leads (its DNS answer) is checked when connecting
(`executors.safe_connect`).
"""

from __future__ import annotations

import contextlib
import ipaddress
from urllib.parse import SplitResult, urlsplit, urlunsplit

import httpx
import idna
from toolbus_contracts.errors import HostNotAllowed
from toolbus_contracts.names import is_allow_entry, split_allow_entry

_DEFAULT_PORTS = {"http": 80, "https": 443}


def normalize_host(host: str) -> str:
    """The form hosts are compared in; raises ValueError for a name IDNA refuses."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.endswith("."):
        host = host[:-1]
    if not host:
        raise ValueError("empty host")
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        pass
    numeric = whatwg_ipv4(host)
    if numeric is not None:
        return numeric
    last = host.rsplit(".", 1)[-1]
    if last.isdigit() or last.startswith("0x"):
        raise ValueError("a host ending in a number is an IPv4 address, and this one is not valid")
    if host.isascii():
        # Plain ASCII labels (including ones IDNA 2008 would refuse, like underscores) compare as is.
        return host
    return idna.encode(host, uts46=True).decode("ascii")


def _ipv4_part(part: str) -> int | None:
    if part.startswith(("0x", "0X")):
        digits, base = part[2:], 16
    elif len(part) > 1 and part.startswith("0"):
        digits, base = part[1:], 8
    else:
        digits, base = part, 10
    if digits == "":
        return 0 if base == 16 else None
    try:
        return int(digits, base)
    except ValueError:
        return None


def whatwg_ipv4(host: str) -> str | None:
    """The dotted-quad address of a host written in one of the IPv4 forms URL parsers accept
    (decimal `2130706433`, short `127.1`, hex or octal parts), or None when it is a name."""
    parts = host.split(".")
    if parts and parts[-1] == "":
        parts.pop()
    if not parts or len(parts) > 4:
        return None
    last = parts[-1]
    if not (last.isdigit() or last.lower().startswith("0x")):
        return None
    numbers = [_ipv4_part(p) for p in parts]
    if any(n is None for n in numbers):
        return None
    values = [n for n in numbers if n is not None]
    if any(v > 255 for v in values[:-1]) or values[-1] >= 256 ** (5 - len(values)):
        return None
    address = values[-1]
    for i, value in enumerate(values[:-1]):
        address += value << (8 * (3 - i))
    return str(ipaddress.IPv4Address(address))


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class AllowList:
    """Compiled allow entries of one toolset. An entry with a port allows only that port (the
    URL's own, or 80/443 for http/https where it gives none); one without allows any."""

    def __init__(self, entries: list[str]) -> None:
        exact: dict[str, set[int | None]] = {}
        suffixes: dict[str, set[int | None]] = {}
        for entry in entries:
            if not is_allow_entry(entry):
                continue  # refused at registration; a toolset pinned before that check gets no wildcard
            host, port = split_allow_entry(entry)
            wild = host.startswith("*.")
            with contextlib.suppress(ValueError, idna.IDNAError):
                if wild:
                    suffixes.setdefault("." + normalize_host(host[2:]), set()).add(port)
                else:
                    exact.setdefault(normalize_host(host), set()).add(port)
        self.exact = {host: frozenset(ports) for host, ports in exact.items()}
        self.suffixes = tuple(sorted((s, frozenset(p)) for s, p in suffixes.items()))

    def ports(self, host: str) -> frozenset[int | None]:
        """The ports the entries matching a normalized host allow (None: any); empty: none match."""
        ports = set(self.exact.get(host, frozenset()))
        if not _is_ip(host):
            for suffix, allowed in self.suffixes:
                if host.endswith(suffix) and len(host) > len(suffix):
                    ports |= allowed
        return frozenset(ports)

    def check(self, url: str) -> SplitResult:
        """The parsed URL with its host normalized, or `HostNotAllowed` naming the host."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise HostNotAllowed(f"'{url[:200]}' is not a valid URL.", details={"host": ""}) from None
        raw_host = parts.hostname or ""
        if parts.scheme.lower() not in ("http", "https"):
            raise HostNotAllowed(
                f"Only http and https URLs may be fetched, not '{parts.scheme}' (host '{raw_host}').",
                details={"host": raw_host},
            )
        if "@" in parts.netloc:
            raise HostNotAllowed(
                f"URLs with user info are refused (host '{raw_host}').", details={"host": raw_host}
            )
        try:
            host = normalize_host(raw_host)
        except (ValueError, idna.IDNAError):
            raise HostNotAllowed(
                f"Host '{raw_host}' is not a valid host name.", details={"host": raw_host}
            ) from None
        used = _DEFAULT_PORTS[parts.scheme.lower()] if port is None else port
        ports = self.ports(host)
        if not ports:
            raise HostNotAllowed(
                f"Host '{host}' is not on this toolset's http allow-list.", details={"host": host}
            )
        if None not in ports and used not in ports:
            default = "" if port is not None else f", {parts.scheme.lower()}'s default"
            raise HostNotAllowed(
                f"Host '{host}' is on this toolset's http allow-list for other ports, not {used}{default}.",
                details={"host": host, "port": used},
            )
        netloc = f"[{host}]" if ":" in host else host
        if port is not None:
            netloc += f":{port}"
        checked = parts._replace(scheme=parts.scheme.lower(), netloc=netloc)
        try:  # what urlsplit lets through but the client would not send: control characters, 64 KiB+
            httpx.URL(urlunsplit(checked))
        except httpx.InvalidURL as exc:
            raise HostNotAllowed(
                f"The URL for '{host}' is not a valid URL: {exc}", details={"host": host}
            ) from None
        return checked
