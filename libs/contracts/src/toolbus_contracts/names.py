"""Names that become part of a Redis key, a KV key or a NATS subject: one charset and length each,
checked at the edge so a bad one is `invalidRequest` naming the field, never a store error.

| name                          | charset                         | length |
|-------------------------------|---------------------------------|--------|
| `namespace`                   | `[A-Za-z0-9_.@-]` (an email fits) | 1–128 |
| `runId`                       | `[A-Za-z0-9_-]` (a subject token) | 1–128 |
| `callId`                      | `[A-Za-z0-9_-]`                 | 1–128  |
| server, workflow names        | `[A-Za-z_][A-Za-z0-9_]*`        | 1–64   |
| host tool names               | one or two such parts, `a.b`    | 1–129  |
| workflow versions             | 12 lowercase hex digits         | 12     |
| `idempotencyKey`              | printable ASCII, no space (`[\x21-\x7e]`) | 1–256 |
| toolset ids                   | `ts_` and 64 lowercase hex digits | 67   |
| `approvalId`                  | `[A-Za-z0-9_-]`                 | 1–128  |

The idempotency key becomes no key of a store, but it travels as an HTTP header value
(`Idempotency-Key`, to MCP servers and `http.fetch`): printable ASCII can be sent as it is, whatever
the server (a UUID, a ULID, `order-42:refund` all fit).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import AfterValidator, Field

NAME_MAX = 64
"""Longest server, workflow or host-tool part name."""
TOOL_NAME_MAX = 256
"""Characters of a qualified tool name (`server.tool`) a call may name: a listed tool longer than
that is refused when pinning, so no declaration offers a tool that cannot be called."""

NAMESPACE_PATTERN = r"^[A-Za-z0-9_.@-]+$"
TOKEN_PATTERN = r"^[A-Za-z0-9_-]+$"

Namespace = Annotated[str, Field(min_length=1, max_length=128, pattern=NAMESPACE_PATTERN)]
RunId = Annotated[str, Field(min_length=1, max_length=128, pattern=TOKEN_PATTERN)]
CallId = Annotated[str, Field(min_length=1, max_length=128, pattern=TOKEN_PATTERN)]
ApprovalId = Annotated[str, Field(min_length=1, max_length=128, pattern=TOKEN_PATTERN)]
WorkflowVersion = Annotated[str, Field(pattern=r"^[0-9a-f]{12}$")]
IDEMPOTENCY_KEY_PATTERN = r"^[\x21-\x7e]+$"
IdempotencyKey = Annotated[str, Field(min_length=1, max_length=256, pattern=IDEMPOTENCY_KEY_PATTERN)]

TOOLSET_ID = re.compile(r"^ts_[0-9a-f]{64}$")


def _check_toolset_id(value: str) -> str:
    if not TOOLSET_ID.fullmatch(value):
        raise ValueError("a toolset id is 'ts_' and 64 lowercase hex digits")
    return value


ToolsetId = Annotated[str, AfterValidator(_check_toolset_id)]
"""A toolset's content id, as `toolsets.create` gives it; anything else is `invalidRequest`
wherever a request names a toolset (never looked up: a store key or subject of any size)."""

_LABEL = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")


def is_ip_literal(host: str) -> bool:
    """An IPv4 address in dotted-quad form, or an IPv6 address (bare or in brackets)."""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_host_name(host: str) -> bool:
    """A DNS host name (ASCII, or IDNA-encodable) whose last label is not numeric: a name ending
    in a number (`1`, `127.1`, `0x7f`) is an IPv4 address to a URL parser, not a name."""
    host = host.lower().removesuffix(".")
    if not host or len(host) > 253:
        return False
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            return False
    labels = host.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        return False
    last = labels[-1]
    return not (last.isdigit() or re.fullmatch(r"0x[0-9a-f]*", last))


def split_allow_entry(entry: str) -> tuple[str, int | None]:
    """(host part, port or None) of an allow entry: `host`, `host:port`, `[v6]`, `[v6]:port` or a
    bare IPv6 literal (its colons are no port). The port is None where none is given, or -1 where
    what follows the colon is not a port (1-65535, digits only)."""
    if entry.startswith("["):
        close = entry.find("]")
        host, rest = (entry[: close + 1], entry[close + 1 :]) if close > 0 else (entry, "")
    elif entry.count(":") == 1:
        host, _, port = entry.partition(":")
        rest = ":" + port
    else:
        host, rest = entry, ""
    if not rest:
        return host, None
    digits = rest[1:]
    if rest[0] != ":" or not (digits.isascii() and digits.isdigit()) or len(digits) > 5:
        return host, -1
    if not 1 <= int(digits) <= 65535:
        return host, -1
    return host, int(digits)


def is_allow_entry(entry: str) -> bool:
    """An http allow entry: a host name, `*.` and a host name, or an IP literal, each optionally
    with `:port`. A numeric wildcard (`*.1`) is refused: it would match dotted numbers that are
    loopback addresses."""
    if len(entry) > 270:
        return False
    host, port = split_allow_entry(entry)
    if port == -1 or len(host) > 260:
        return False
    if host.startswith("*."):
        return is_host_name(host[2:])
    return is_ip_literal(host) or is_host_name(host)


def normalize_allow_entry(entry: str) -> str:
    """The pinned form of a valid allow entry: lower-cased, the host's trailing dot dropped, the
    port written without leading zeros (the same string as before ports existed, for one without)."""
    host, port = split_allow_entry(entry.strip())
    host = host.lower().rstrip(".")
    return host if port is None else f"{host}:{port}"
