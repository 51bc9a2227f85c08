"""Approvals in Redis: one hash per approval plus sorted-set indexes, changed only by Lua scripts so
that every transition (create, decide, expire, cancel) is atomic and the first decision wins.

Layout (see `toolbus_common.keys.Keys`, approvals section): the approval hash keeps the
`ApprovalNeeded` body it was created from, so a decision always carries the binding (tool, toolset
id, input digest) of what was asked, never anything a decider sends. Pending approvals are indexed
by requestedAt globally, per run and per namespace. What follows a change goes out through the
service's outbox (`toolbus_common.outbox`), written by the script that makes the change: the
`approval.requested` event (and its webhook, `toolbus_common.webhooks`) with the approval, the
decision for the dispatcher with the decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import orjson
from redis.asyncio import Redis
from toolbus_common.canonical import sha256_hex
from toolbus_common.keys import Keys
from toolbus_common.outbox import LUA as OUTBOX_LUA
from toolbus_common.webhooks import LUA as WEBHOOK_LUA
from toolbus_common.webhooks import webhook_body
from toolbus_contracts import Subjects
from toolbus_contracts.approvals import ApprovalRequested, Decision
from toolbus_contracts.internal import ApprovalDecided, ApprovalNeeded

State = Literal["pending", "approved", "denied", "cancelled"]

DECIDED_TTL_SECONDS = 30 * 24 * 3600
"""How long a decided or cancelled approval is kept (a later decide answers `conflict`, after that
`notFound`); the INTERNAL stream keeps commands as long."""

CLOSED_RUN_TTL_SECONDS = 31 * 24 * 3600
"""How long a closed run is remembered, so an ApprovalNeeded redelivered after its RunClosed is
cancelled rather than left pending: longer than the INTERNAL stream keeps a message."""

WEBHOOK_EVENT = "approval.requested"

CANCELLED_REASON = "run closed"
EXPIRED_REASON = "expired"

# KEYS: approval, pending, pending_run, pending_ns, expiry, outbox, closed_run, webhook, webhooks due
# ARGV: needed_json, run_id, namespace ('' = none), requested_ms, expires_ms ('' = never), id, now_ms,
#       ttl, requested subject, requested JSON ('' = not announced), webhook type ('' = none),
#       webhook body, webhook id
# The announcement's outbox entry is kept on the approval (`announcement`): a decision or cancel
# that comes before the relay sent it deletes it, so an approval ended at once is not announced.
# A repeat that finds it pending and never announced (stored for a remembered decision that has
# since expired, the process gone before deciding it) announces it now: `{'exists', 'pending',
# 'announced'}`.
_CREATE = (
    OUTBOX_LUA
    + WEBHOOK_LUA
    + """
local function announce()
  local entry = outbox_add(KEYS[6], ARGV[9], 'approval-requested-' .. ARGV[6], ARGV[10])
  redis.call('HSET', KEYS[1], 'announcement', entry)
  if ARGV[11] ~= '' then webhook_add(KEYS[8], KEYS[9], ARGV[11], ARGV[12], ARGV[7], ARGV[13]) end
end
local state = redis.call('HGET', KEYS[1], 'state')
if state then
  if state == 'pending' and ARGV[10] ~= '' and redis.call('HEXISTS', KEYS[1], 'announcement') == 0 then
    announce()
    return {'exists', state, 'announced'}
  end
  return {'exists', state}
end
if redis.call('EXISTS', KEYS[7]) == 1 then
  redis.call('HSET', KEYS[1], 'needed', ARGV[1], 'runId', ARGV[2], 'namespace', ARGV[3],
             'state', 'cancelled', 'reason', 'run closed', 'decidedAt', ARGV[7])
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[8]))
  return {'cancelled', 'cancelled'}
end
redis.call('HSET', KEYS[1], 'needed', ARGV[1], 'runId', ARGV[2], 'namespace', ARGV[3], 'state', 'pending')
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[6])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[6])
if ARGV[3] ~= '' then redis.call('ZADD', KEYS[4], ARGV[4], ARGV[6]) end
if ARGV[5] ~= '' then redis.call('ZADD', KEYS[5], ARGV[5], ARGV[6]) end
if ARGV[10] ~= '' then
  announce()
  return {'created', 'pending', 'announced'}
end
return {'created', 'pending'}
"""
)

# KEYS: approval, pending, pending_run, pending_ns, expiry, outbox, decided
# ARGV: new state, reason ('' = none), decided_at (ISO), id, now_ms, ttl, decided? ('1'/'0'),
#       edited input JSON ('' = none), decider ('' = none), decisions subject, decision JSON
_DECIDE = (
    OUTBOX_LUA
    + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {'missing'} end
if state ~= 'pending' then
  return {'taken', state, redis.call('HGET', KEYS[1], 'reason') or ''}
end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'decidedAt', ARGV[3])
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], 'reason', ARGV[2]) end
if ARGV[8] ~= '' then redis.call('HSET', KEYS[1], 'editedInput', ARGV[8]) end
if ARGV[9] ~= '' then redis.call('HSET', KEYS[1], 'decider', ARGV[9]) end
if ARGV[7] == '1' then
  redis.call('ZADD', KEYS[7], ARGV[5], ARGV[4])
  redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', tonumber(ARGV[5]) - tonumber(ARGV[6]) * 1000)
end
redis.call('ZREM', KEYS[2], ARGV[4])
redis.call('ZREM', KEYS[3], ARGV[4])
redis.call('ZREM', KEYS[4], ARGV[4])
redis.call('ZREM', KEYS[5], ARGV[4])
local announcement = redis.call('HGET', KEYS[1], 'announcement')
if announcement then redis.call('XDEL', KEYS[6], announcement) end
if ARGV[7] == '1' then outbox_add(KEYS[6], ARGV[10], 'approval-decided-' .. ARGV[4], ARGV[11]) end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[6]))
return {'ok', ARGV[1]}
"""
)


def webhook_id(approval_id: str) -> str:
    """The one webhook id of an approval's `approval.requested`: a resend after a crash reuses it,
    so the receiver can drop the duplicate (Standard Webhooks `webhook-id`)."""
    return f"msg_approval_requested_{approval_id}"


# KEYS: approval, outbox, legacy queue, webhook, webhooks due. ARGV: id, subject, message id,
# body ('' = nothing owed), webhook type ('' = none), webhook body, webhook id, now_ms.
_ADOPT = (
    OUTBOX_LUA
    + WEBHOOK_LUA
    + """
if ARGV[4] ~= '' then
  local entry = outbox_add(KEYS[2], ARGV[2], ARGV[3], ARGV[4])
  if ARGV[5] ~= '' then
    redis.call('HSET', KEYS[1], 'announcement', entry)
    webhook_add(KEYS[4], KEYS[5], ARGV[5], ARGV[6], ARGV[8], ARGV[7])
  end
end
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
"""
)


@dataclass(frozen=True, slots=True)
class StoredApproval:
    """One approval as stored: the request it came from and where it stands."""

    needed: ApprovalNeeded
    state: State
    reason: str | None
    decided_at: str | None
    edited_input: dict[str, Any] | None = None
    decider: str | None = None

    def requested(self) -> ApprovalRequested:
        """The public `approval.requested` body (the input digest stays internal)."""
        n = self.needed
        return ApprovalRequested(
            approval_id=n.approval_id,
            call_id=n.call_id,
            run_id=n.run_id,
            namespace=n.namespace,
            toolset_id=n.toolset_id,
            tool=n.tool,
            input=n.input,
            requested_at=n.requested_at,
            rule_error=n.rule_error,
        )

    def decided(self) -> ApprovalDecided:
        """The command for the dispatcher, bound to the tool, toolset and input digest asked about."""
        if self.state not in ("approved", "denied"):
            raise ValueError(f"approval {self.needed.approval_id} is {self.state}, not decided")
        decision: Decision = "approved" if self.state == "approved" else "denied"
        n = self.needed
        return ApprovalDecided(
            approval_id=n.approval_id,
            call_id=n.call_id,
            run_id=n.run_id,
            toolset_id=n.toolset_id,
            tool=n.tool,
            input_digest=n.input_digest,
            decision=decision,
            reason=self.reason,
            input=self.edited_input,
            edited_input_digest=None if self.edited_input is None else sha256_hex(self.edited_input),
            decider=self.decider,
        )


@dataclass(frozen=True, slots=True)
class CreateResult:
    created: bool
    """True only the first time this approval id is stored."""
    state: State
    announced: bool = False
    """True when this call owed its announcement (on creation, or late: see `_CREATE`)."""


@dataclass(frozen=True, slots=True)
class DecideResult:
    """`outcome` is `ok` (this decision won), `missing` (no such approval) or `taken` (an earlier
    decision, an expiry or a cancel came first: `state` and `reason` say which)."""

    outcome: Literal["ok", "missing", "taken"]
    state: State | None = None
    reason: str | None = None


Position = tuple[int, str]
"""A place in a pending index: (requested ms, approval id)."""


def epoch_ms(iso: str) -> int:
    """Milliseconds since the epoch of an RFC 3339 timestamp (naive ones are taken as UTC)."""
    moment = datetime.fromisoformat(iso)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _s(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else value


class ApprovalStore:
    """The approvals of one deployment (`keys`) in Redis. Every method is safe to call from several
    replicas at once."""

    def __init__(
        self, redis: Redis[bytes], keys: Keys, subjects: Subjects, *, webhooks: bool = False
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._subjects = subjects
        self._webhooks = webhooks
        """Whether an announcement stores its webhook (`TOOLBUS_WEBHOOK_URL` is set)."""
        self._create = redis.register_script(_CREATE)
        self._decide = redis.register_script(_DECIDE)
        self._adopt = redis.register_script(_ADOPT)

    async def create(
        self, needed: ApprovalNeeded, *, expires_ms: int | None, now_ms: int, announce: bool = True
    ) -> CreateResult:
        """Store a pending approval once per approval id (a repeat changes nothing), index it, and
        (with `announce`) owe its `approval.requested` event and webhook, also on a repeat that finds
        it pending and never announced. If its run already closed it is stored as `cancelled`."""
        k = self._keys
        ns = needed.namespace or ""
        requested = StoredApproval(needed, "pending", None, None).requested().wire()
        hook = webhook_id(needed.approval_id)
        keys = [
            k.approval(needed.approval_id),
            k.approvals_pending,
            k.approvals_pending_run(needed.run_id),
            k.approvals_pending_namespace(ns),
            k.approvals_expiry,
            k.approvals_outbox,
            k.approvals_closed_run(needed.run_id),
            k.approvals_webhook(hook),
            k.approvals_webhooks_due,
        ]
        argv = [
            needed.model_dump_json(by_alias=True),
            needed.run_id,
            ns,
            str(epoch_ms(needed.requested_at)),
            "" if expires_ms is None else str(expires_ms),
            needed.approval_id,
            str(now_ms),
            str(DECIDED_TTL_SECONDS),
            self._subjects.approvals_requested,
            orjson.dumps(requested).decode() if announce else "",
            WEBHOOK_EVENT if self._webhooks else "",
            webhook_body(WEBHOOK_EVENT, requested).decode() if self._webhooks else "",
            hook,
        ]
        outcome, state, *announced = (_s(x) for x in await self._create(keys=keys, args=argv))
        return CreateResult(
            created=outcome == "created",
            state=state,  # type: ignore[arg-type]
            announced=bool(announced),
        )

    async def get(self, approval_id: str) -> StoredApproval | None:
        raw = await self._redis.hgetall(self._keys.approval(approval_id))
        return self._parse(raw) if raw else None

    async def get_many(self, approval_ids: list[str]) -> list[StoredApproval]:
        """The approvals that exist among `approval_ids`, in that order (one round trip)."""
        if not approval_ids:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for approval_id in approval_ids:
            pipe.hgetall(self._keys.approval(approval_id))
        rows: list[dict[bytes, bytes]] = await pipe.execute()
        return [self._parse(raw) for raw in rows if raw]

    async def get_rows(self, approval_ids: list[str]) -> list[StoredApproval | None]:
        """The approvals of `approval_ids`, in that order, None for one that is gone (one round trip)."""
        if not approval_ids:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for approval_id in approval_ids:
            pipe.hgetall(self._keys.approval(approval_id))
        rows: list[dict[bytes, bytes]] = await pipe.execute()
        return [self._parse(raw) if raw else None for raw in rows]

    @staticmethod
    def _parse(raw: dict[bytes, bytes]) -> StoredApproval:
        needed = ApprovalNeeded.model_validate_json(raw[b"needed"], by_alias=True)
        return StoredApproval(
            needed=needed,
            state=raw[b"state"].decode(),  # type: ignore[arg-type]
            reason=_s(raw.get(b"reason")),
            decided_at=_s(raw.get(b"decidedAt")),
            edited_input=orjson.loads(raw[b"editedInput"]) if b"editedInput" in raw else None,
            decider=_s(raw.get(b"decider")),
        )

    async def pending_ids(
        self, *, run_id: str | None, namespace: str | None, after: Position | None = None, count: int
    ) -> list[Position]:
        """Up to `count` pending approvals, oldest request first, after `after` (from the first
        without), from the narrowest index that applies: (requested ms, id) each. An index orders
        approvals by request time, then by id: `after` is a place in that order, so it holds
        however many approvals are decided in the meantime."""
        k = self._keys
        if run_id is not None:
            index = k.approvals_pending_run(run_id)
        elif namespace is not None:
            index = k.approvals_pending_namespace(namespace)
        else:
            index = k.approvals_pending
        if after is None:
            rows = await self._redis.zrange(index, 0, count - 1, withscores=True)
        else:
            ms, last = after
            pipe = self._redis.pipeline(transaction=False)
            pipe.zrangebyscore(index, ms, ms, withscores=True)  # those of the same millisecond
            pipe.zrangebyscore(index, f"({ms}", "+inf", start=0, num=count, withscores=True)
            ties, later = await pipe.execute()
            rows = [(m, score) for m, score in ties if m.decode() > last] + later
        return [(int(score), m.decode()) for m, score in rows[:count]]

    async def transition(
        self,
        approval_id: str,
        state: State,
        reason: str | None,
        *,
        decided_at: str,
        now_ms: int,
        edited_input: dict[str, Any] | None = None,
        decider: str | None = None,
    ) -> DecideResult:
        """Move a pending approval to `state` atomically; only the first transition wins. A decision
        (`approved`/`denied`) also goes to the outbox for the dispatcher; a cancel does not."""
        k = self._keys
        head = await self._redis.hmget(k.approval(approval_id), ["runId", "namespace", "needed"])
        run_id, namespace = _s(head[0]), _s(head[1])
        if run_id is None or head[2] is None:
            return DecideResult("missing")
        decided = ""
        if state != "cancelled":  # what the dispatcher is sent if this transition wins
            needed = ApprovalNeeded.model_validate_json(head[2], by_alias=True)
            stored = StoredApproval(needed, state, reason, decided_at, edited_input, decider)
            decided = stored.decided().wire_json().decode()
        keys = [
            k.approval(approval_id),
            k.approvals_pending,
            k.approvals_pending_run(run_id),
            k.approvals_pending_namespace(namespace or ""),
            k.approvals_expiry,
            k.approvals_outbox,
            k.approvals_decided,
        ]
        argv = [
            state,
            reason or "",
            decided_at,
            approval_id,
            str(now_ms),
            str(DECIDED_TTL_SECONDS),
            "0" if state == "cancelled" else "1",
            "" if edited_input is None else orjson.dumps(edited_input).decode(),
            decider or "",
            self._subjects.internal_approval_decisions,
            decided,
        ]
        reply = [_s(x) for x in await self._decide(keys=keys, args=argv)]
        if reply[0] == "missing":
            return DecideResult("missing")
        if reply[0] == "taken":
            return DecideResult("taken", state=reply[1], reason=reply[2] or None)  # type: ignore[arg-type]
        return DecideResult("ok", state=state, reason=reason)

    async def decided_ids(
        self, *, before: Position | None, since_ms: int | None, count: int
    ) -> list[Position]:
        """Up to `count` decisions, newest first, strictly before `before` (from the newest
        without), none decided before `since_ms`: (decided ms, id) each."""
        index = self._keys.approvals_decided
        low: Any = "-inf" if since_ms is None else since_ms
        if before is None:
            rows = await self._redis.zrevrangebyscore(index, "+inf", low, start=0, num=count, withscores=True)
        else:
            ms, last = before
            pipe = self._redis.pipeline(transaction=False)
            pipe.zrangebyscore(index, ms, ms, withscores=True)  # those of the same millisecond
            pipe.zrevrangebyscore(index, f"({ms}", low, start=0, num=count, withscores=True)
            ties, earlier = await pipe.execute()
            ties = sorted(((m, sc) for m, sc in ties if m.decode() < last), key=lambda r: r[0], reverse=True)
            rows = ties + earlier
        return [(int(score), m.decode()) for m, score in rows[:count]]

    async def mark_run_closed(self, run_id: str) -> list[str]:
        """Remember that the run closed and return its pending approval ids."""
        await self._redis.set(self._keys.approvals_closed_run(run_id), b"1", ex=CLOSED_RUN_TTL_SECONDS)
        return [m.decode() for m in await self._redis.zrange(self._keys.approvals_pending_run(run_id), 0, -1)]

    async def due_expiries(self, now_ms: int, limit: int = 100) -> list[str]:
        members = await self._redis.zrangebyscore(self._keys.approvals_expiry, "-inf", now_ms, 0, limit)
        return [m.decode() for m in members]

    async def drop_expiry(self, approval_id: str) -> None:
        await self._redis.zrem(self._keys.approvals_expiry, approval_id)

    async def adopt_legacy_queues(self, now_ms: int) -> int:
        """Owe through the outbox what a version before it had queued and not sent (the
        `announce` and `outbox` sorted sets): a pending approval's announcement, a decision; each
        member is dropped with its entry written. Returns how many were owed."""
        k = self._keys
        owed = 0
        for queue, wanted in zip(k.approvals_legacy_queues, ("pending", "decided"), strict=True):
            for raw in await self._redis.zrange(queue, 0, -1):
                approval_id = raw.decode()
                stored = await self.get(approval_id)
                hook = webhook_id(approval_id)
                args = [approval_id, "", "", "", "", "", hook, str(now_ms)]
                if stored is not None and wanted == "pending" and stored.state == "pending":
                    requested = stored.requested().wire()
                    args[1:4] = [
                        self._subjects.approvals_requested,
                        f"approval-requested-{approval_id}",
                        orjson.dumps(requested).decode(),
                    ]
                    if self._webhooks:
                        args[4:6] = [WEBHOOK_EVENT, webhook_body(WEBHOOK_EVENT, requested).decode()]
                elif stored is not None and wanted == "decided" and stored.state in ("approved", "denied"):
                    args[1:4] = [
                        self._subjects.internal_approval_decisions,
                        f"approval-decided-{approval_id}",
                        stored.decided().wire_json().decode(),
                    ]
                keys = [
                    k.approval(approval_id),
                    k.approvals_outbox,
                    queue,
                    k.approvals_webhook(hook),
                    k.approvals_webhooks_due,
                ]
                await self._adopt(keys=keys, args=args)
                owed += bool(args[3])
        return owed
