"""Bearer tokens toolbus issues: made here, shown once, stored only as their SHA-256 in Redis with
the namespace and toolsets they allow, expiring, listed and revocable.

Keys (under the deployment's key prefix `K`): `K:gw:token:<sha256>` holds the token's info as
JSON and expires with it (a check is one GET); `K:gw:tokens` maps each token id to its hash and
info (lists and revocations)."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson
from redis.asyncio import Redis
from toolbus_contracts.base import parse_duration
from toolbus_contracts.errors import NotFound
from toolbus_contracts.gateway import TokenCreateRequest, TokenInfo

TOKEN_PREFIX = "tbg_"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass(frozen=True)
class IssuedToken:
    token: str
    info: TokenInfo


class TokenStore:
    """The gateway's tokens in Redis."""

    def __init__(self, redis: Redis[bytes], key_prefix: str) -> None:
        self._redis = redis
        self._token = f"{key_prefix}:gw:token:"
        self._index = f"{key_prefix}:gw:tokens"

    async def create(self, request: TokenCreateRequest, *, now: datetime | None = None) -> IssuedToken:
        now = now or datetime.now(UTC)
        expires = now + parse_duration(request.ttl)
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        info = TokenInfo(
            id=f"tok_{secrets.token_hex(12)}",
            namespace=request.namespace,
            toolsets=sorted(set(request.toolsets)),
            created_at=_iso(now),
            expires_at=_iso(expires),
            label=request.label,
        )
        digest = token_hash(token)
        entry = orjson.dumps({"sha256": digest, "info": info.wire()})
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(self._token + digest, info.wire_json(), pxat=int(expires.timestamp() * 1000))
            pipe.hset(self._index, info.id, entry)
            await pipe.execute()
        return IssuedToken(token, info)

    async def check(self, token: str, *, now: datetime | None = None) -> TokenInfo | None:
        """The info of a live token, else None (unknown, revoked or expired)."""
        if not token.startswith(TOKEN_PREFIX):
            return None
        raw = await self._redis.get(self._token + token_hash(token))
        if raw is None:
            return None
        info = TokenInfo.model_validate_json(raw)
        if _parse_iso(info.expires_at) <= (now or datetime.now(UTC)):
            return None
        return info

    async def list(self, namespace: str | None = None, *, now: datetime | None = None) -> list[TokenInfo]:
        """Live tokens, oldest first; expired ones are dropped from the index as they are met."""
        now = now or datetime.now(UTC)
        out: list[TokenInfo] = []
        expired: list[bytes] = []
        for token_id, raw in (await self._redis.hgetall(self._index)).items():
            info = TokenInfo.model_validate(orjson.loads(raw)["info"])
            if _parse_iso(info.expires_at) <= now:
                expired.append(token_id)
            elif namespace is None or info.namespace == namespace:
                out.append(info)
        if expired:
            await self._redis.hdel(self._index, *expired)
        return sorted(out, key=lambda i: (i.created_at, i.id))

    async def revoke(self, token_id: str) -> None:
        """Revoke at once (the next request with the token is 401); unknown id: `NotFound`."""
        raw = await self._redis.hget(self._index, token_id)
        if raw is None:
            raise NotFound(f"No token {token_id} (never issued, revoked, or expired).")
        digest = orjson.loads(raw)["sha256"]
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._token + digest)
            pipe.hdel(self._index, token_id)
            await pipe.execute()
