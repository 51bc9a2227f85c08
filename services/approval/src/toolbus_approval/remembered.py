"""Remembered decisions in Redis: a decision a person asked to apply again, at once, to later calls
of the same namespace and tool (optionally only the same input) until it expires or is revoked.

A remembered decision is a hash with an expiry, found through a scope key per (namespace, tool,
input digest or `*`) that expires with it; the newest decision for a scope replaces the one before.
"""

from __future__ import annotations

import os
from typing import Any

import orjson
from redis.asyncio import Redis
from toolbus_common.keys import Keys
from toolbus_contracts.approvals import RememberedDecision

ANY_INPUT = "*"

# KEYS: the remembered hash, its scope key, the index. ARGV: id, body JSON, expires ms.
_PUT = """
redis.call('SET', KEYS[1], ARGV[2], 'PXAT', ARGV[3])
redis.call('SET', KEYS[2], ARGV[1], 'PXAT', ARGV[3])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
return 1
"""

# KEYS: the remembered hash, its scope key, the index. ARGV: id.
_REVOKE = """
local existed = redis.call('DEL', KEYS[1])
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
redis.call('ZREM', KEYS[3], ARGV[1])
return existed
"""


def new_remembered_id() -> str:
    return "rem_" + os.urandom(16).hex()


class RememberedStore:
    """Remembered decisions of one deployment (`keys`); safe from several replicas at once."""

    def __init__(self, redis: Redis[bytes], keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._put = redis.register_script(_PUT)
        self._revoke = redis.register_script(_REVOKE)

    def _scope(self, decision: RememberedDecision) -> str:
        return self._keys.approvals_remembered_scope(
            decision.namespace or "", decision.tool, decision.input_digest or ANY_INPUT
        )

    async def put(self, decision: RememberedDecision, *, expires_ms: int) -> None:
        keys = [
            self._keys.approvals_remembered(decision.remembered_id),
            self._scope(decision),
            self._keys.approvals_remembered_index,
        ]
        await self._put(keys=keys, args=[decision.remembered_id, decision.wire_json(), str(expires_ms)])

    async def get(self, remembered_id: str) -> RememberedDecision | None:
        raw = await self._redis.get(self._keys.approvals_remembered(remembered_id))
        return None if raw is None else RememberedDecision.model_validate_json(raw)

    async def match(self, namespace: str | None, tool: str, input_digest: str) -> RememberedDecision | None:
        """The remembered decision for this input, else the one for any input of the tool."""
        k = self._keys
        ns = namespace or ""
        ids = await self._redis.mget(
            [
                k.approvals_remembered_scope(ns, tool, input_digest),
                k.approvals_remembered_scope(ns, tool, ANY_INPUT),
            ]
        )
        for found in ids:
            if found is not None:
                decision = await self.get(found.decode())
                if decision is not None:
                    return decision
        return None

    async def revoke(self, remembered_id: str) -> bool:
        """Forget it; False when there was none (unknown, expired, revoked already)."""
        decision = await self.get(remembered_id)
        if decision is None:
            await self._redis.zrem(self._keys.approvals_remembered_index, remembered_id)
            return False
        keys = [
            self._keys.approvals_remembered(remembered_id),
            self._scope(decision),
            self._keys.approvals_remembered_index,
        ]
        return bool(await self._revoke(keys=keys, args=[remembered_id]))

    async def in_force(
        self, now_ms: int, *, namespace: str | None, tool: str | None, limit: int
    ) -> tuple[list[RememberedDecision], bool]:
        """Those not expired, soonest to expire first, matching the filters: at most `limit`, and
        whether more matched."""
        index = self._keys.approvals_remembered_index
        await self._redis.zremrangebyscore(index, "-inf", now_ms)
        found: list[RememberedDecision] = []
        start = 0
        while True:
            ids = await self._redis.zrangebyscore(index, f"({now_ms}", "+inf", start=start, num=500)
            if not ids:
                return found, False
            start += len(ids)
            raws: list[Any] = await self._redis.mget(
                [self._keys.approvals_remembered(i.decode()) for i in ids]
            )
            for raw in raws:
                if raw is None:
                    continue
                decision = RememberedDecision.model_validate(orjson.loads(raw))
                if (namespace is None or decision.namespace == namespace) and (
                    tool is None or decision.tool == tool
                ):
                    if len(found) == limit:
                        return found, True
                    found.append(decision)
