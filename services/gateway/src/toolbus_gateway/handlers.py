"""The gateway's subjects: parse, call the token store, reply. No logic here."""

from __future__ import annotations

from toolbus_common.bus import Routes
from toolbus_contracts.gateway import (
    TokenCreateReply,
    TokenCreateRequest,
    TokenRevokeReply,
    TokenRevokeRequest,
    TokensListReply,
    TokensListRequest,
)

from toolbus_gateway.tokens import TokenStore

routes: Routes[TokenStore] = Routes("gateway")


@routes.request(lambda s: s.tokens_create)
async def handle_create(tokens: TokenStore, request: TokenCreateRequest) -> TokenCreateReply:
    """Issue a bearer token for the MCP endpoint: shown in this reply only, stored hashed."""
    issued = await tokens.create(request)
    return TokenCreateReply(token=issued.token, info=issued.info)


@routes.request(lambda s: s.tokens_list)
async def handle_list(tokens: TokenStore, request: TokensListRequest) -> TokensListReply:
    """Live tokens (never the tokens themselves), oldest first, optionally of one namespace."""
    return TokensListReply(tokens=await tokens.list(request.namespace))


@routes.request(lambda s: s.tokens_revoke)
async def handle_revoke(tokens: TokenStore, request: TokenRevokeRequest) -> TokenRevokeReply:
    """Revoke a token at once; an unknown id is `notFound`."""
    await tokens.revoke(request.id)
    return TokenRevokeReply(id=request.id, revoked=True)
