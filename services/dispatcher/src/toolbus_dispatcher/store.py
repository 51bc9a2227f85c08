"""The durable state of runs and calls in Redis, behind atomic Lua scripts.

Every method is one round trip. The hot path of a call is two of them: `create_call` (idempotency
check, store, enqueue, take slots) and `finish` (store outcome, free slots, admit the next waiting
calls). Admitted calls come back with their fields, so the caller starts them without reading again.
Runs on a single Redis (or a primary with replicas), not Redis Cluster: scripts touch the keys a
call's hash names.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from toolbus_common.keys import Keys
from toolbus_common.outbox import LUA as OUTBOX_LUA
from toolbus_common.redis_values import text as _s
from toolbus_common.script_pipe import NoScript, ScriptPipe
from toolbus_contracts.registry import RUN_CONCURRENCY

from toolbus_dispatcher.records import CallRecord

MAX_SCAN = 1000
"""How many waiting calls of one run admission looks at, at most, per script run."""


def _load(name: str, *, with_admit: bool = True) -> str:
    lua = resources.files("toolbus_dispatcher") / "lua"
    body = (lua / name).read_text()
    return (OUTBOX_LUA + (lua / "admit.lua").read_text() + "\n" + body) if with_admit else body


@dataclass(frozen=True, slots=True)
class Lua:
    """A registered script with its text and SHA1 (EVALSHA's name for it)."""

    script: AsyncScript
    text: str
    sha: str

    @staticmethod
    def register(redis: Redis[bytes], text: str) -> Lua:
        return Lua(redis.register_script(text), text, hashlib.sha1(text.encode()).hexdigest())


class ScriptRunner:
    """The hot-path scripts (create, finish) over a `ScriptPipe`: one write per call, replies
    pipelined on one connection. A `NOSCRIPT` (Redis restarted or flushed its script cache) loads
    the script through redis-py and runs it; the script had not run, so that is safe."""

    def __init__(self, pipe: ScriptPipe) -> None:
        self.pipe = pipe

    async def run(self, script: Lua, keys: list[str], args: list[Any]) -> Any:
        try:
            return await self.pipe.evalsha(script.sha, keys, args)
        except NoScript:
            return await script.script(keys=keys, args=args)


@dataclass(slots=True)
class Created:
    """What `create_call` did: `created`, `exists` (same key again), `differs` (the key names a call
    of another tool or input text: nothing was registered) or `notFound`. `admitted`:
    the calls to start here (for `exists`, those the first create admitted that are still ours
    and running: its reply may have been lost)."""

    status: str
    cred_version: str
    call_id: str = ""
    state: str = ""
    outcome_json: str = ""
    admitted: list[CallRecord] = field(default_factory=list)
    tool: str = ""
    """For `differs`: the tool and input JSON of the call the key already names."""
    input_json: str = ""


@dataclass(slots=True)
class Finished:
    status: str
    replies: list[str]
    admitted: list[CallRecord]
    run_id: str = ""
    key: str = ""


CLOSE_CLAIM = 15.0
"""Seconds a close's claim on answering the invokers of the calls it cancelled holds against
another dispatcher's close (close_run.lua, on Redis's clock): past it, the first closer is taken
as dead."""


@dataclass(slots=True)
class Closed:
    status: str
    toolset_id: str
    call_ids: list[str]
    cancelled: list[tuple[str, list[str], str]]


class CallStore:
    """Runs, calls, slots, queues and leases of one deployment (`Keys` prefix), for one owner."""

    def __init__(
        self,
        redis: Redis[bytes],
        keys: Keys,
        owner: str,
        *,
        lease: float,
        pipe: ScriptPipe,
        events_prefix: str,
        runs_closed_subject: str,
    ) -> None:
        self._r = redis
        self.keys = keys
        self.outbox = keys.call_events_outbox
        self.events_prefix = events_prefix
        """Subject prefix of call events, `<P>.events.calls.`: an event goes to prefix + run.call."""
        self.runs_closed_subject = runs_closed_subject
        """Where a run's close queues its `RunClosed` command (through the outbox, like events)."""
        self.owner = owner
        self.lease = lease
        self._call_prefix = keys.call("")
        self._replies_prefix = keys.call_replies("")
        self._create = Lua.register(redis, _load("create_call.lua"))
        self._finish = Lua.register(redis, _load("finish_call.lua"))
        self._park: AsyncScript = redis.register_script(_load("park_call.lua"))
        self._release: AsyncScript = redis.register_script(_load("release_waiting.lua"))
        self._next: AsyncScript = redis.register_script(_load("next_attempt.lua"))
        self._renew: AsyncScript = redis.register_script(_load("renew_leases.lua"))
        self._reap: AsyncScript = redis.register_script(_load("reap_leases.lua"))
        self._open: AsyncScript = redis.register_script(_load("open_run.lua", with_admit=False))
        self._close: AsyncScript = redis.register_script(_load("close_run.lua"))
        self._batch = ScriptRunner(pipe)

    async def load_scripts(self) -> None:
        """Load the hot-path scripts into Redis once (the pipe sends EVALSHA only)."""
        for lua in (self._create, self._finish):
            await self._r.execute_command("SCRIPT", "LOAD", lua.text)  # type: ignore[no-untyped-call]

    def _lease(self) -> str:
        """The lease's length, as the scripts take it: they add it to Redis's clock (`TIME`), so
        the replicas' clocks need not agree."""
        return repr(self.lease)

    # ---- runs -----------------------------------------------------------------------------------

    async def open_run(self, run_id: str, toolset_id: str, namespace: str | None, now: str) -> str:
        """`opened`, `open` (already, same toolset and no other namespace), `conflict` (other
        toolset), `namespace` (same toolset, another namespace given) or `closed`."""
        return _s(await self._open(keys=[self.keys.run(run_id)], args=[toolset_id, namespace or "", now]))

    async def run_info(self, run_id: str) -> tuple[str, str, str | None] | None:
        """(state, toolsetId, namespace) of a run, or None when there is no such run."""
        state, ts, ns = await self._r.hmget(self.keys.run(run_id), ["state", "toolsetId", "namespace"])
        if state is None or ts is None:
            return None
        return _s(state), _s(ts), (_s(ns) or None) if ns else None

    async def close_run(self, run_id: str, now: str, cancelled_json: str, retention: float) -> Closed:
        """Close a run (`closed`), or answer a repeated close the same (`alreadyClosed`, with the
        calls the first close cancelled); `notFound`. The `RunClosed` command is queued in the
        outbox by the close itself."""
        k = self.keys
        res = await self._close(
            keys=[
                k.run(run_id),
                k.run_calls(run_id),
                k.run_keys(run_id),
                k.run_waiting(run_id),
                k.run_slots(run_id),
                k.call_leases,
                self.outbox,
            ],
            args=[
                now,
                cancelled_json,
                self._call_prefix,
                self._replies_prefix,
                int(retention),
                run_id,
                self.runs_closed_subject,
                self.owner,
                repr(CLOSE_CLAIM),
                now,
                self.events_prefix,
            ],
        )
        status = _s(res[0])
        if status == "notFound":
            return Closed(status, "", [], [])
        return Closed(
            status,
            _s(res[1]),
            [_s(c) for c in res[2]],
            [(_s(item[0]), [_s(r) for r in item[1]], _s(item[2])) for item in res[3]],
        )

    async def answered(self, call_ids: list[str]) -> None:
        """The invokers of these calls, which a close cancelled, were answered: no later close
        answers them again (their reply subjects go)."""
        await self._r.delete(*(self.keys.call_replies(cid) for cid in call_ids))

    # ---- calls ----------------------------------------------------------------------------------

    async def create_call(
        self,
        *,
        call_id: str,
        run_id: str,
        idempotency_key: str,
        tool: str,
        input_json: str,
        toolset_id: str,
        namespace: str | None,
        concurrency: int | None,
        on_interruption: str,
        reply: str,
        now: str,
        approval_id: str,
        digest: str,
        announce: tuple[str, bytes] | None = None,
    ) -> Created:
        """Store a call (see the script). `announce` (subject, body: the ApprovalNeeded command of
        a call that waits for approval) goes into the outbox in the same script."""
        k = self.keys
        res: list[Any] = await self._batch.run(
            self._create,
            [
                k.run(run_id),
                k.run_keys(run_id),
                k.run_calls(run_id),
                k.call(call_id),
                k.call_replies(call_id),
                k.run_waiting(run_id),
                k.run_slots(run_id),
                k.call_leases,
                k.credentials_version,
                self.outbox,
            ],
            [
                call_id,
                idempotency_key,
                tool,
                input_json,
                toolset_id,
                concurrency or "",
                on_interruption,
                reply,
                now,
                self._lease(),
                self.owner,
                approval_id,
                digest,
                self._call_prefix,
                k.run_tool_slots(run_id, tool) if concurrency else "",
                RUN_CONCURRENCY,
                MAX_SCAN,
                self._replies_prefix,
                run_id,
                *(announce or ("", "")),
                now,
                self.events_prefix,
            ],
        )
        status = _s(res[0])
        cred_version = _s(res[1])
        if status == "created":
            return Created(
                status,
                cred_version,
                _s(res[2]),
                _s(res[3]),
                admitted=[
                    CallRecord(
                        call_id,
                        run_id,
                        tool,
                        input_json,
                        idempotency_key,
                        toolset_id,
                        namespace,
                        on_interruption,
                        int(item[1][1]),
                        "running",
                    )
                    if _s(item[1][0]) == "self"
                    else CallRecord.from_script(item)
                    for item in res[4]
                ],
            )
        if status == "exists":
            handed = [CallRecord.from_script(i) for i in res[5]] if len(res) > 5 else []
            return Created(status, cred_version, _s(res[2]), _s(res[3]), _s(res[4]), handed)
        if status == "differs":
            return Created(status, cred_version, _s(res[2]), tool=_s(res[3]), input_json=_s(res[4]))
        return Created(status, cred_version)

    async def finish(self, call_id: str, outcome_json: str, now: str) -> Finished:
        """Store the outcome of a call we own; `stale` when it is no longer ours."""
        k = self.keys
        res = await self._batch.run(
            self._finish,
            [k.call(call_id), k.call_replies(call_id), k.call_leases, self.outbox],
            [
                call_id,
                self.owner,
                outcome_json,
                now,
                self._lease(),
                self._call_prefix,
                RUN_CONCURRENCY,
                MAX_SCAN,
                now,
                self.events_prefix,
            ],
        )
        return Finished(_s(res[0]), [_s(r) for r in res[1]], [CallRecord.from_script(i) for i in res[2]])

    async def park(
        self, call_id: str, server: str, level: str, now: str, *, announce: tuple[str, bytes]
    ) -> Finished:
        """Park a running call of ours; `announce` (subject, body: the CallParked command) goes
        into the outbox in the same script, for the relay to publish."""
        k = self.keys
        subject, body = announce
        res = await self._park(
            keys=[k.call(call_id), k.call_leases, self.outbox],
            args=[
                call_id,
                self.owner,
                server,
                level,
                now,
                self._lease(),
                self._call_prefix,
                RUN_CONCURRENCY,
                MAX_SCAN,
                subject,
                body,
                now,
                self.events_prefix,
            ],
        )
        return Finished(_s(res[0]), [], [CallRecord.from_script(i) for i in res[1]])

    async def release_waiting(
        self,
        call_id: str,
        from_state: str,
        *,
        outcome_json: str = "",
        now: str,
        approval: tuple[str, str, str, str] | None = None,
        reason: str = "",
        edited: tuple[str, str] | None = None,
        decider: str = "",
    ) -> Finished:
        """Queue a call held in `from_state` for a slot, or end it with `outcome_json`.

        `approval` (approvalId, tool, toolsetId, digest) must all match the call, else `mismatch`.
        `edited` (input JSON, its digest): the input an approval sends instead of the one asked.
        """
        k = self.keys
        res = await self._release(
            keys=[k.call(call_id), k.call_replies(call_id), k.call_leases, self.outbox],
            args=[
                call_id,
                from_state,
                outcome_json,
                self.owner,
                now,
                self._lease(),
                self._call_prefix,
                RUN_CONCURRENCY,
                MAX_SCAN,
                *(approval or ("", "", "", "")),
                reason,
                *(edited or ("", "")),
                decider,
                now,  # the last two: NOW and EVENTS of the event prelude
                self.events_prefix,
            ],
        )
        return Finished(
            _s(res[0]),
            [_s(r) for r in res[1]],
            [CallRecord.from_script(i) for i in res[2]],
            _s(res[3]),
            _s(res[4]),
        )

    async def next_attempt(self, call_id: str, now: str) -> int:
        """The number of the attempt that starts now (its `attemptStarted` written), or 0 when
        the call is no longer ours."""
        return int(
            await self._next(
                keys=[self.keys.call(call_id), self.outbox],
                args=[self.owner, call_id, now, self.events_prefix],
            )
        )

    async def renew(self, call_ids: list[str]) -> list[str]:
        """Extend the leases of our running calls; returns the ones that are no longer ours."""
        if not call_ids:
            return []
        res = await self._renew(
            keys=[self.keys.call_leases], args=[self.owner, self._lease(), self._call_prefix, *call_ids]
        )
        return [_s(c) for c in res]

    async def reap(self, limit: int = 100) -> list[CallRecord]:
        """Claim running calls whose lease expired; each had its attempt interrupted."""
        res = await self._reap(
            keys=[self.keys.call_leases, self.outbox],
            args=[self.owner, self._lease(), self._call_prefix, limit, "", ""],
        )
        return [CallRecord.from_script(i) for i in res]

    async def get_call(self, call_id: str) -> tuple[str, int, str | None] | None:
        """(state, attempts, outcomeJson) of a call, or None."""
        state, attempts, outcome = await self._r.hmget(
            self.keys.call(call_id), ["state", "attempts", "outcome"]
        )
        if state is None:
            return None
        return _s(state), int(attempts or 0), _s(outcome) if outcome else None
