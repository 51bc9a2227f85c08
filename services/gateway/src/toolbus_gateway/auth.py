"""Who is calling: a bearer token toolbus issued (`tokens`), or a JWT of the deployment's identity
provider checked against its JWKS. Either gives a `Principal`: the namespace whose credentials
the calls use and the toolsets it may reach; nothing the client says otherwise counts."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import jwt
from jwt import PyJWKClient

from toolbus_gateway.settings import GatewaySettings
from toolbus_gateway.tokens import TokenStore


@dataclass(frozen=True)
class Principal:
    """An authenticated caller. `key` identifies the credential (token id, or issuer and
    subject), for binding a stateless client's run to it."""

    namespace: str
    toolsets: frozenset[str]
    key: str

    def may_reach(self, toolset_id: str) -> bool:
        return toolset_id in self.toolsets


class Unauthenticated(Exception):
    """No usable bearer credential: the reason goes in `WWW-Authenticate` (never the token)."""

    def __init__(self, reason: str, *, error: str | None = "invalid_token") -> None:
        super().__init__(reason)
        self.reason = reason
        self.error = error


class JwtVerifier:
    """JWTs signed by a key of the provider's JWKS, with this issuer and audience, not expired;
    the namespace from a configured claim. Keys are fetched (off the event loop) and cached."""

    def __init__(
        self,
        jwks_url: str,
        *,
        issuer: str,
        audience: str,
        namespace_claim: str,
        toolsets_claim: str,
        algorithms: Sequence[str],
    ) -> None:
        self._jwks = PyJWKClient(jwks_url, cache_keys=True, lifespan=300, timeout=10)
        self._issuer = issuer
        self._audience = audience
        self._namespace_claim = namespace_claim
        self._toolsets_claim = toolsets_claim
        self._algorithms = list(algorithms)

    async def verify(self, token: str) -> Principal:
        try:
            key = await asyncio.to_thread(self._jwks.get_signing_key_from_jwt, token)
            claims = jwt.decode(
                token,
                key.key,
                algorithms=self._algorithms,
                audience=self._audience,
                issuer=self._issuer,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("The token has expired.") from None
        except jwt.PyJWKClientConnectionError:
            raise Unauthenticated("The identity provider's keys could not be fetched.") from None
        except jwt.PyJWTError as exc:
            raise Unauthenticated(f"The token was refused: {type(exc).__name__}.") from None
        namespace = claims.get(self._namespace_claim)
        if not isinstance(namespace, str) or not namespace:
            raise Unauthenticated(f"The token has no '{self._namespace_claim}' claim naming the user.")
        raw = claims.get(self._toolsets_claim, [])
        toolsets = raw.split() if isinstance(raw, str) else raw
        if not isinstance(toolsets, list) or not all(isinstance(t, str) for t in toolsets):
            raise Unauthenticated(f"The token's '{self._toolsets_claim}' claim is not a list of toolset ids.")
        return Principal(namespace, frozenset(toolsets), f"jwt:{self._issuer}:{namespace}")


class Authenticator:
    """Turns an `Authorization` header into a `Principal`, or `Unauthenticated`."""

    def __init__(self, tokens: TokenStore, jwt_verifier: JwtVerifier | None) -> None:
        self._tokens = tokens
        self._jwt = jwt_verifier

    @staticmethod
    def from_settings(tokens: TokenStore, settings: GatewaySettings) -> Authenticator:
        verifier = None
        if settings.jwt_jwks_url:
            if not settings.jwt_issuer or not settings.jwt_audience:
                raise ValueError("TOOLBUS_GATEWAY_JWT_ISSUER and _AUDIENCE are needed with _JWKS_URL")
            verifier = JwtVerifier(
                settings.jwt_jwks_url,
                issuer=settings.jwt_issuer,
                audience=settings.jwt_audience,
                namespace_claim=settings.jwt_namespace_claim,
                toolsets_claim=settings.jwt_toolsets_claim,
                algorithms=[a.strip() for a in settings.jwt_algorithms.split(",") if a.strip()],
            )
        return Authenticator(tokens, verifier)

    async def authenticate(self, authorization: str | None) -> Principal:
        if not authorization:
            raise Unauthenticated("A bearer token is required.", error=None)
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated(
                "The Authorization header is not 'Bearer <token>'.", error="invalid_request"
            )
        if token.count(".") == 2 and self._jwt is not None:
            return await self._jwt.verify(token)
        info = await self._tokens.check(token)
        if info is None:
            raise Unauthenticated("The token is unknown, revoked or expired.")
        return Principal(info.namespace, frozenset(info.toolsets), f"token:{info.id}")
