"""Parked calls in Redis: per level and scope, in park order, with the `credentials.expired`
notification state of each server there, and the `CallsResume` owed when calls are unparked (the
service's outbox, `toolbus_common.outbox`).

Every change is one Lua script, so a crash between steps never leaves a call half parked. The
scripts touch keys named in the stored records (single-node Redis or a Redis with all toolbus keys
on one node; not Redis Cluster).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from redis.asyncio import Redis
from toolbus_common.keys import Keys
from toolbus_common.outbox import LUA as OUTBOX_LUA
from toolbus_common.redis_values import text as _str
from toolbus_contracts import Subjects
from toolbus_contracts.credentials import CredentialLevel
from toolbus_contracts.internal import CallsResume

# KEYS: scope zset, scope servers, notified, index, where, seq, run set, notify due, set version
# ARGV: call id, server, park time ms, where json, notice json, notice due ms, credentials version
# of the failing attempt ('' when unknown)
# Returns {newly parked 0|1, notice scheduled 0|1, stale 0|1}. The first call parked for a server
# at a scope schedules the notice durably, in the same script: a crash right after loses nothing.
# Stale: credentials were set at the scope after the failing attempt resolved its headers (the set
# ran before this park was recorded, so it resumed nothing): not parked, the caller resumes it.
_PARK = """
if redis.call('HEXISTS', KEYS[5], ARGV[1]) == 1 then return {0, 0, 0} end
if ARGV[7] ~= '' and tonumber(redis.call('GET', KEYS[9]) or '0') > tonumber(ARGV[7]) then
  return {0, 0, 1}
end
local seq = redis.call('INCR', KEYS[6])
redis.call('ZADD', KEYS[1], seq, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
redis.call('HSET', KEYS[5], ARGV[1], ARGV[4])
redis.call('SADD', KEYS[7], ARGV[1])
if redis.call('HSETNX', KEYS[3], ARGV[2], 'pending') == 1 then
  redis.call('ZADD', KEYS[8], ARGV[6], ARGV[5])
  return {1, 1, 0}
end
return {1, 0, 0}
"""

# KEYS: set version. ARGV: the version a set gave. Keeps the highest.
_NOTE_SET = """
if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
"""

# Claim up to ARGV[3] notices due at ARGV[1] by pushing them to ARGV[2] (a lease).
_CLAIM_NOTICES = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
for _, n in ipairs(due) do redis.call('ZADD', KEYS[1], ARGV[2], n) end
return due
"""

# KEYS: index, where, outbox. ARGV: resume subject ('' = no resume), its message id, its body,
# then the call ids. Returns the ids that were parked (and now are not). With a subject, the
# `CallsResume` goes into the outbox (toolbus_common.outbox) in the same step: a crash right after
# loses nothing, and the calls are never unparked without their resume being owed.
_REMOVE = (
    OUTBOX_LUA
    + """
local removed = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  local w = redis.call('HGET', KEYS[2], id)
  if w then
    local d = cjson.decode(w)
    local server = redis.call('HGET', d.servers, id)
    redis.call('ZREM', d.z, id)
    redis.call('HDEL', d.servers, id)
    redis.call('SREM', d.run, id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('ZREM', KEYS[1], id)
    if server then
      local still = false
      for _, s in ipairs(redis.call('HVALS', d.servers)) do
        if s == server then still = true; break end
      end
      if not still then redis.call('HDEL', d.notified, server) end
    end
    table.insert(removed, id)
  end
end
if ARGV[1] ~= '' then outbox_add(KEYS[3], ARGV[1], ARGV[2], ARGV[3]) end
return removed
"""
)

# KEYS: notified. ARGV: server. Marks the notification sent, unless the scope was cleared meanwhile.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""

_MARK_SENT = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then redis.call('HSET', KEYS[1], ARGV[1], 'sent') end
return 1
"""


@dataclass(frozen=True, slots=True)
class ParkResult:
    newly_parked: bool
    notice_scheduled: bool
    """True for the first call parked for its server at its scope: a `credentials.expired`
    notice is due after the notify delay."""
    stale: bool = False
    """Not parked: credentials were set at its level and scope after its failing attempt resolved
    its headers; the caller resumes it now."""


@dataclass(frozen=True, slots=True)
class Notice:
    """A `credentials.expired` notice to send for one level+scope+server."""

    level: CredentialLevel
    scope: str
    server: str
    toolset_id: str
    namespace: str | None
    run_id: str | None
    trigger: str
    """The call whose park scheduled the notice (gives the webhook a stable id)."""
    raw: bytes

    @classmethod
    def parse(cls, raw: bytes) -> Notice:
        d = json.loads(raw)
        return cls(
            d["level"], d["scope"], d["server"], d["toolsetId"], d["namespace"], d["runId"], d["trigger"], raw
        )


class ParkingLot:
    """Calls waiting for new credentials at one level and scope."""

    def __init__(self, redis: Redis[bytes], keys: Keys, subjects: Subjects) -> None:
        self._redis = redis
        self._keys = keys
        self._resume_subject = subjects.internal_calls_resume
        self._park = redis.register_script(_PARK)
        self._remove = redis.register_script(_REMOVE)
        self._mark_sent = redis.register_script(_MARK_SENT)
        self._release = redis.register_script(_RELEASE)
        self._claim_notices = redis.register_script(_CLAIM_NOTICES)
        self._note_set = redis.register_script(_NOTE_SET)

    async def note_set(self, level: CredentialLevel, scope: str, version: int) -> None:
        """Record that a set at level+scope gave credentials version `version`. Runs before the
        set collects the calls parked there, so a park recorded after that sees it (see `park`)."""
        await self._note_set(keys=[self._keys.credentials_set_version(level, scope)], args=[version])

    async def park(
        self,
        *,
        call_id: str,
        run_id: str,
        server: str,
        level: CredentialLevel,
        scope: str,
        toolset_id: str,
        namespace: str | None,
        notify_delay_ms: int = 0,
        parked_at_ms: int | None = None,
        credentials_version: int | None = None,
    ) -> ParkResult:
        """Park `call_id` at level+scope (idempotent: parking it again changes nothing), unless
        credentials were set there at a version above `credentials_version` (the one its failing
        attempt resolved at): then it is stale, not parked."""
        k = self._keys
        now_ms = int(time.time() * 1000)
        notice = json.dumps(
            {
                "level": level,
                "scope": scope,
                "server": server,
                "toolsetId": toolset_id,
                "namespace": namespace if level != "toolset" else None,
                "runId": run_id if level == "run" else None,
                "trigger": call_id,
            }
        )
        where = json.dumps(
            {
                "level": level,
                "scope": scope,
                "runId": run_id,
                "server": server,
                "z": k.parked(level, scope),
                "servers": k.parked_servers(level, scope),
                "notified": k.parked_notified(level, scope),
                "run": k.parked_by_run(run_id),
            }
        )
        raw = await self._park(
            keys=[
                k.parked(level, scope),
                k.parked_servers(level, scope),
                k.parked_notified(level, scope),
                k.parked_index,
                k.parked_where,
                k.parked_seq,
                k.parked_by_run(run_id),
                k.parked_notify_due,
                k.credentials_set_version(level, scope),
            ],
            args=[
                call_id,
                server,
                parked_at_ms or now_ms,
                where,
                notice,
                now_ms + notify_delay_ms,
                "" if credentials_version is None else credentials_version,
            ],
        )
        return ParkResult(bool(int(raw[0])), bool(int(raw[1])), bool(int(raw[2])))

    async def claim_notices(self, now_ms: int, lease_ms: int = 30_000, limit: int = 50) -> list[Notice]:
        """Notices due now, leased to this caller (another replica takes them only after the lease)."""
        raw = await self._claim_notices(
            keys=[self._keys.parked_notify_due], args=[now_ms, now_ms + lease_ms, limit]
        )
        return [Notice.parse(r if isinstance(r, bytes) else str(r).encode()) for r in raw]

    async def notice_done(self, notice: Notice) -> None:
        """The notice went out (or had nothing left to say): mark it sent and drop it."""
        await self._mark_sent(
            keys=[self._keys.parked_notified(notice.level, notice.scope)], args=[notice.server]
        )
        await self._redis.zrem(self._keys.parked_notify_due, notice.raw)

    async def parked_for(self, level: CredentialLevel, scope: str, server: str) -> list[str]:
        """The calls parked at level+scope for `server`, in park order."""
        ids = await self.parked_at(level, scope)
        if not ids:
            return []
        servers = await self._redis.hmget(self._keys.parked_servers(level, scope), ids)
        return [i for i, s in zip(ids, servers, strict=True) if s is not None and s.decode() == server]

    async def parked_at(self, level: CredentialLevel, scope: str) -> list[str]:
        """The calls parked at level+scope, in park order."""
        return [_str(x) for x in await self._redis.zrange(self._keys.parked(level, scope), 0, -1)]

    async def of_run(self, run_id: str) -> list[str]:
        return sorted(_str(x) for x in await self._redis.smembers(self._keys.parked_by_run(run_id)))

    async def older_than(self, cutoff_ms: int, limit: int = 500) -> list[str]:
        """Calls parked before `cutoff_ms` (ms since epoch), oldest first."""
        raw = await self._redis.zrangebyscore(self._keys.parked_index, "-inf", cutoff_ms, start=0, num=limit)
        return [_str(x) for x in raw]

    async def remove(self, call_ids: list[str]) -> list[str]:
        """Unpark these calls wherever they are (no resume: their run closed); returns those that
        were parked."""
        if not call_ids:
            return []
        return await self._unpark(call_ids, "", "", b"")

    async def resume(self, message: CallsResume) -> list[str]:
        """Unpark the message's calls wherever they are and owe the message to the dispatcher (the
        outbox relay publishes it, signed, to the INTERNAL stream), in one step; returns the calls
        that were parked. Calls not parked are resumed too (the dispatcher holds them parked)."""
        msg_id = f"callsResume:{uuid.uuid4().hex}"
        return await self._unpark(message.call_ids, self._resume_subject, msg_id, message.wire_json())

    async def _unpark(self, call_ids: list[str], subject: str, msg_id: str, body: bytes) -> list[str]:
        k = self._keys
        raw = await self._remove(
            keys=[k.parked_index, k.parked_where, k.parked_outbox], args=[subject, msg_id, body, *call_ids]
        )
        return [_str(x) for x in raw]

    async def is_parked(self, call_id: str) -> bool:
        return bool(await self._redis.hexists(self._keys.parked_where, call_id))

    async def try_sweep_lock(self, holder: str, ttl_ms: int) -> bool:
        """One replica at a time ends calls parked too long."""
        return bool(await self._redis.set(self._keys.parked_sweep_lock, holder, nx=True, px=ttl_ms))

    async def release_sweep_lock(self, holder: str) -> None:
        await self._release(keys=[self._keys.parked_sweep_lock], args=[holder])
