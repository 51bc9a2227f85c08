"""Signing in through the deployment's OpenID Connect provider: authorization code with PKCE
(authlib builds the messages, httpx sends them, as in the credentials service's
`oauth_protocol`), the ID token verified with PyJWT against the provider's JWKS
(signature, issuer, audience, expiry, nonce). The verifier and nonce wait in Redis, never in a
cookie; each sign-in's `state` is used once."""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
import orjson
from authlib.common.security import generate_token  # type: ignore[import-untyped]
from authlib.oauth2.rfc6749.parameters import prepare_grant_uri, prepare_token_request  # type: ignore[import-untyped]
from authlib.oauth2.rfc7636 import create_s256_code_challenge  # type: ignore[import-untyped]
from redis.asyncio import Redis
from toolbus_common.keys import Keys

log = logging.getLogger(__name__)

LOGIN_TTL_SECONDS = 600
"""How long a person has, from the provider's page, to come back."""
ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
"""ID token algorithms taken: signed with the provider's keys, never with the client secret."""
JWKS_REFRESH_SECONDS = 300


class SignInFailed(Exception):
    """Why a sign-in did not complete, in words for the person (no token, no code)."""


@dataclass(frozen=True, slots=True)
class Claims:
    subject: str
    name: str
    groups: tuple[str, ...]


class OidcClient:
    """One provider (`issuer`), one client; discovery and keys fetched on first use, keys again
    when a token names one not known."""

    def __init__(
        self,
        *,
        issuer: str,
        client_id: str,
        client_secret: str | None,
        redirect_uri: str,
        scopes: str,
        groups_claim: str,
        redis: Redis[bytes],
        keys: Keys,
        http: httpx.AsyncClient,
    ) -> None:
        self.issuer = issuer.rstrip("/")
        self._client_id = client_id
        self._client_secret = client_secret
        self._redirect_uri = redirect_uri
        self._scopes = scopes
        self._groups_claim = groups_claim
        self._redis = redis
        self._keys = keys
        self._http = http
        self._meta: dict[str, Any] | None = None
        self._jwks: jwt.PyJWKSet | None = None
        self._jwks_at = 0.0
        self._lock = asyncio.Lock()

    async def metadata(self) -> dict[str, Any]:
        if self._meta is None:
            response = await self._http.get(f"{self.issuer}/.well-known/openid-configuration")
            response.raise_for_status()
            meta: dict[str, Any] = response.json()
            if meta.get("issuer", "").rstrip("/") != self.issuer:
                raise SignInFailed("the provider's discovery document names another issuer")
            self._meta = meta
        return self._meta

    async def begin(self) -> tuple[str, str]:
        """(the provider's authorization URL, the `state` to keep in the person's session)."""
        meta = await self.metadata()
        state, nonce, verifier = generate_token(32), generate_token(32), generate_token(64)
        key = self._keys.approvals_console_login(state)
        body = orjson.dumps({"verifier": verifier, "nonce": nonce})
        await self._redis.set(key, body, ex=LOGIN_TTL_SECONDS)
        url = prepare_grant_uri(
            meta["authorization_endpoint"],
            self._client_id,
            "code",
            redirect_uri=self._redirect_uri,
            scope=self._scopes,
            state=state,
            nonce=nonce,
            code_challenge=create_s256_code_challenge(verifier),
            code_challenge_method="S256",
        )
        return str(url), state

    async def complete(self, query: dict[str, str], expected_state: str | None) -> Claims:
        """The person's verified claims from the provider's redirect, or `SignInFailed`."""
        state = query.get("state", "")
        if not expected_state or not hmac.compare_digest(state.encode(), expected_state.encode()):
            raise SignInFailed("this sign-in was not started in this browser, or it was already used")
        key = self._keys.approvals_console_login(state)
        raw = await self._redis.get(key)
        if raw is None or not await self._redis.delete(key):
            raise SignInFailed("this sign-in expired or was already used; sign in again")
        if "error" in query:
            raise SignInFailed(f"the provider refused: {query['error'][:100]}")
        if query.get("iss") and query["iss"].rstrip("/") != self.issuer:
            raise SignInFailed("the answer came from another issuer")
        started = orjson.loads(raw)
        meta = await self.metadata()
        body = prepare_token_request(
            "authorization_code",
            code=query.get("code", ""),
            redirect_uri=self._redirect_uri,
            code_verifier=started["verifier"],
            **({} if self._client_secret else {"client_id": self._client_id}),
        )
        auth: dict[str, Any] = {}
        if self._client_secret:
            auth["auth"] = httpx.BasicAuth(self._client_id, self._client_secret)
        headers = {"Accept": "application/json", "Content-Type": "application/x-www-form-urlencoded"}
        try:
            response = await self._http.post(meta["token_endpoint"], content=body, headers=headers, **auth)
            token = response.json() if response.status_code == 200 else {}
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("console sign-in: token request failed", extra={"error": type(exc).__name__})
            raise SignInFailed("the provider did not answer; try again") from None
        if response.status_code != 200:
            log.warning("console sign-in: token refused", extra={"status": response.status_code})
            raise SignInFailed("the provider did not accept the sign-in; try again")
        id_token = token.get("id_token")
        if not isinstance(id_token, str):
            raise SignInFailed("the provider sent no ID token")
        claims = await self.verify(id_token, meta, nonce=started["nonce"])
        groups = claims.get(self._groups_claim) or []
        if isinstance(groups, str):
            groups = [groups]
        name = claims.get("name") or claims.get("preferred_username") or claims.get("email") or claims["sub"]
        return Claims(
            subject=str(claims["sub"]),
            name=str(name),
            groups=tuple(str(g) for g in groups if isinstance(g, str | int)),
        )

    async def _key(self, id_token: str, meta: dict[str, Any]) -> jwt.PyJWK:
        kid = jwt.get_unverified_header(id_token).get("kid")
        async with self._lock:
            for attempt in range(2):
                stale = time.monotonic() - self._jwks_at > JWKS_REFRESH_SECONDS
                if self._jwks is None or stale or attempt:
                    response = await self._http.get(meta["jwks_uri"])
                    response.raise_for_status()
                    self._jwks = jwt.PyJWKSet.from_dict(response.json())
                    self._jwks_at = time.monotonic()
                usable = [k for k in self._jwks.keys if k.public_key_use in (None, "sig")]
                found = [k for k in usable if kid is None or k.key_id == kid]
                if found:
                    return found[0]
        raise SignInFailed("the ID token is signed with a key the provider does not publish")

    async def verify(self, id_token: str, meta: dict[str, Any], *, nonce: str) -> dict[str, Any]:
        """The ID token's claims once its signature (the provider's published keys, asymmetric
        algorithms only), issuer, audience, expiry and nonce hold; else `SignInFailed`."""
        offered = meta.get("id_token_signing_alg_values_supported") or ["RS256"]
        algorithms = [a for a in offered if a in ASYMMETRIC]
        try:
            key = await self._key(id_token, meta)
            claims: dict[str, Any] = jwt.decode(
                id_token,
                key.key,
                algorithms=algorithms,
                audience=self._client_id,
                issuer=meta["issuer"],
                options={"require": ["exp", "iat", "sub", "aud", "iss"]},
                leeway=30,
            )
        except jwt.PyJWTError as exc:
            raise SignInFailed(f"the ID token is not valid ({type(exc).__name__})") from None
        if not hmac.compare_digest(str(claims.get("nonce", "")).encode(), nonce.encode()):
            raise SignInFailed("the ID token is not for this sign-in (nonce)")
        return claims
