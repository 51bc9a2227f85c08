"""Bearer tokens for the gateway's MCP endpoint (`‹p›.tokens.*`): issue one for an end user and
the toolsets it may reach, list them (never the tokens themselves), revoke one."""

from __future__ import annotations

from toolbus_contracts.gateway import (
    TokenCreateReply,
    TokenCreateRequest,
    TokenInfo,
    TokenRevokeRequest,
    TokensListReply,
    TokensListRequest,
)

from toolbus._core import Core, build
from toolbus._toolsets import Toolset, toolset_id


class Tokens:
    """`tb.tokens`: the gateway's bearer tokens."""

    def __init__(self, tb: Core) -> None:
        self._tb = tb

    async def create(
        self,
        namespace: str,
        toolsets: list[Toolset | str],
        *,
        ttl: str | None = None,
        label: str | None = None,
    ) -> TokenCreateReply:
        """A new token (`reply.token`, shown this once) for `namespace`'s calls to `toolsets`,
        valid for `ttl` (a duration; default 720h). Not sent again on `unavailable`: a retry
        could issue a second token."""
        body = build(
            TokenCreateRequest,
            namespace=namespace,
            toolsets=[toolset_id(t) for t in toolsets],
            ttl=ttl,
            label=label,
        )
        return TokenCreateReply.model_validate(await self._tb.request(self._tb.subjects.tokens_create, body))

    async def list(self, namespace: str | None = None) -> list[TokenInfo]:
        """Live tokens, oldest first (of one namespace where given)."""
        body = build(TokensListRequest, namespace=namespace)
        data = await self._tb.request(self._tb.subjects.tokens_list, body, retry=True)
        return TokensListReply.model_validate(data).tokens

    async def revoke(self, token_id: str) -> None:
        """Revoke a token at once; an unknown id is `NotFound`."""
        body = build(TokenRevokeRequest, id=token_id)
        await self._tb.request(self._tb.subjects.tokens_revoke, body, retry=True)
