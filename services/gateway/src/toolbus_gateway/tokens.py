"""Bearer tokens toolbus issues: made here, shown once, stored only as their SHA-256 in Redis with
the namespace and toolsets they allow, expiring, listed and revocable.

Keys (under the deployment's key prefix `K`): `K:gw:token:<sha256>` holds the token's info as
JSON and expires with it (a check is one GET, kept `cache_seconds` in memory); `K:gw:tokens` maps
each token id to its hash and info (lists and revocations)."""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson
from redis.asyncio import Redis
from toolbus_common.lru import Lru
from toolbus_contracts.base import parse_duration
from toolbus_contracts.errors import NotFound
from toolbus_contracts.gateway import TokenCreateRequest, TokenInfo

TOKEN_PREFIX = "tbg_"
CACHED_TOKENS = 10_000
"""Most tokens whose last check is kept in memory (`cache_seconds`)."""


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

    def __init__(self, redis: Redis[bytes], key_prefix: str, *, cache_seconds: float = 0.0) -> None:
        self._redis = redis
        self._token = f"{key_prefix}:gw:token:"
        self._index = f"{key_prefix}:gw:tokens"
        self._cache_seconds = cache_seconds
        self._live: Lru[str, tuple[TokenInfo, datetime, float]] = Lru(CACHED_TOKENS)
        """Tokens checked lately, by digest: info, expiry, when checked (monotonic)."""
        self._revocations = 0
        """Revokes finished here; a check caches only if none finished during its Redis GET."""

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
        now = now or datetime.now(UTC)
        digest = token_hash(token)
        hit = self._live.get(digest)
        if hit is not None and time.monotonic() - hit[2] < self._cache_seconds and hit[1] > now:
            return hit[0]
        revocations = self._revocations
        raw = await self._redis.get(self._token + digest)
        if raw is None:
            self._live.pop(digest)
            return None
        info = TokenInfo.model_validate_json(raw)
        expires = _parse_iso(info.expires_at)
        if expires <= now:
            return None
        if self._cache_seconds > 0 and self._revocations == revocations:
            self._live.put(digest, (info, expires, time.monotonic()))
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
        """Revoke: once this returns the token is refused here (even if a check was under way),
        at other replicas once their cached check is `cache_seconds` old; unknown id: `NotFound`."""
        raw = await self._redis.hget(self._index, token_id)
        if raw is None:
            raise NotFound(f"No token {token_id} (never issued, revoked, or expired).")
        digest = orjson.loads(raw)["sha256"]
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._token + digest)
            pipe.hdel(self._index, token_id)
            await pipe.execute()
        # After the DELETE: drop what a check cached meanwhile, and keep any check whose GET may
        # have read the record before it from caching it when it resumes.
        self._revocations += 1
        self._live.pop(digest)
