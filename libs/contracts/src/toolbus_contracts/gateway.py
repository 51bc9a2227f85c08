"""Gateway bodies: the bearer tokens toolbus issues for its MCP endpoint (`tokens.*`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from toolbus_contracts.base import Duration, WireModel, null_as
from toolbus_contracts.names import Namespace, ToolsetId

TOKEN_TTL_DEFAULT = "720h"
"""How long a token lives when `tokensCreate` names no `ttl` (30 days)."""

TokenId = Annotated[str, Field(pattern=r"^tok_[0-9a-f]{24}$")]


class TokenCreateRequest(WireModel):
    """`tokens.create`: a bearer token for `namespace` (the end user whose credentials its calls
    use), valid for `toolsets` only, for `ttl`."""

    namespace: Namespace
    toolsets: list[ToolsetId] = Field(min_length=1, max_length=100)
    ttl: Annotated[Duration, null_as(TOKEN_TTL_DEFAULT)] = TOKEN_TTL_DEFAULT
    label: str | None = Field(default=None, max_length=200)


class TokenInfo(WireModel):
    """A token as lists show it: never the token itself (only its hash is stored)."""

    id: str
    namespace: str
    toolsets: list[str]
    created_at: str
    expires_at: str
    label: str | None = None


class TokenCreateReply(WireModel):
    """The token, shown this once, and what it allows."""

    token: str
    info: TokenInfo


class TokensListRequest(WireModel):
    namespace: Namespace | None = None


class TokensListReply(WireModel):
    tokens: list[TokenInfo]


class TokenRevokeRequest(WireModel):
    id: TokenId


class TokenRevokeReply(WireModel):
    id: str
    revoked: bool
