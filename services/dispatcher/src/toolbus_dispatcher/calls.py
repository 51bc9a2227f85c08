"""Running the calls this dispatcher owns: attempts under the tool's policy, outcomes, slot
hand-over, lease renewal, and claiming the calls of dispatchers that died.

A call reaches `CallRunner.start` only once a script made it `running` and owned by this process
(admitted into a slot, or claimed from an expired lease). From then on this module is the only
writer of that call until its outcome is stored, it is parked, or it is no longer ours (another
replica claimed it after our lease lapsed, or its run was closed); then its task just stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from toolbus_common.clock import now_iso
from toolbus_common.toolsets import Tool, ToolsetStore
from toolbus_contracts import Subjects, ToolbusError, duration_seconds
from toolbus_contracts.errors import Timeout, UpstreamUnreachable
from toolbus_contracts.internal import CallParked
from toolbus_contracts.registry import ToolKind

from toolbus_dispatcher.events import CallEvents
from toolbus_dispatcher.executors.base import Attempt, Executor, Interrupted, NeedsCredentials
from toolbus_dispatcher.outcomes import after_interruption, backoff, failed, ok
from toolbus_dispatcher.records import CallRecord
from toolbus_dispatcher.store import CallStore

log = logging.getLogger(__name__)


class _NoLongerOurs(Exception):
    """The call was claimed by another replica or ended by its run's close."""


def reply_body(call_id: str, key: str, outcome: Any) -> bytes:
    """The `calls.invoke` success reply; `outcome` is a dict or its stored JSON text."""
    if isinstance(outcome, str):
        return b'{"ok":true,"data":{"callId":%s,"idempotencyKey":%s,"outcome":%s}}' % (
            orjson.dumps(call_id),
            orjson.dumps(key),
            outcome.encode(),
        )
    return orjson.dumps({"ok": True, "data": {"callId": call_id, "idempotencyKey": key, "outcome": outcome}})


class CallRunner:
    """Owns the running calls of this process."""

    def __init__(
        self,
        *,
        store: CallStore,
        toolsets: ToolsetStore,
        executors: Mapping[ToolKind, Executor],
        events: CallEvents,
        nc: NatsClient,
        js: JetStreamContext,
        subjects: Subjects,
        retry_backoff: float,
        retry_backoff_max: float,
    ) -> None:
        self._store = store
        self._toolsets = toolsets
        self._executors = executors
        self._events = events
        self._nc = nc
        self._js = js
        self._subjects = subjects
        self._backoff = retry_backoff
        self._backoff_max = retry_backoff_max
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._leased: set[str] = set()
        self._accepting: dict[str, asyncio.Event] = {}
        self._timeouts: dict[str | None, float | None] = {None: None}

    # ---- admission ------------------------------------------------------------------------------

    def accepting(self, call_id: str) -> asyncio.Event:
        """Mark a call whose `accepted` event is not published yet: its attempt waits for it."""
        event = self._accepting[call_id] = asyncio.Event()
        return event

    def accepted(self, call_id: str) -> None:
        event = self._accepting.pop(call_id, None)
        if event is not None:
            event.set()

    def start(self, records: list[CallRecord], *, reaped: bool = False, announced: str = "") -> None:
        """Run calls a script just made ours (admitted, or claimed from a dead owner), each in a
        task of its own. `announced`: the id of a call whose `attemptStarted` is already out."""
        for rec in records:
            if rec.call_id in self._tasks:
                continue  # our own lease lapsed and we claimed it back: it is still running here
            self._leased.add(rec.call_id)
            task = asyncio.create_task(
                self._drive(rec, reaped, rec.call_id == announced), name=f"call-{rec.call_id}"
            )
            self._tasks[rec.call_id] = task
            task.add_done_callback(self._done_callback(rec.call_id))

    async def run_here(self, rec: CallRecord) -> None:
        """Run a just-admitted call in the current task (a `calls.invoke` handler), whose
        `attemptStarted` was published with its `accepted`: one task and one write less."""
        task = asyncio.current_task()
        assert task is not None
        self._leased.add(rec.call_id)
        self._tasks[rec.call_id] = task
        try:
            await self._drive(rec, False, True)
        finally:
            self._done(rec.call_id)

    def _done_callback(self, call_id: str) -> Callable[[asyncio.Task[None]], None]:
        return lambda _task: self._done(call_id)

    def _done(self, call_id: str) -> None:
        self._tasks.pop(call_id, None)
        self._leased.discard(call_id)

    def stop_local(self, call_ids: list[str]) -> None:
        """Stop running these calls here (their run closed, or another replica owns them now)."""
        for cid in call_ids:
            self._leased.discard(cid)
            task = self._tasks.get(cid)
            if task is not None:
                task.cancel()

    @property
    def running(self) -> int:
        return len(self._tasks)

    # ---- one call -------------------------------------------------------------------------------

    async def _drive(self, rec: CallRecord, reaped: bool, announced: bool = False) -> None:
        waiting = self._accepting.get(rec.call_id)
        if waiting is not None:
            await waiting.wait()
        try:
            outcome = await self._attempts(rec, reaped, announced)
            if outcome is not None:
                await self.finish(rec, outcome)
        except _NoLongerOurs:
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "call failed inside the dispatcher", extra={"callId": rec.call_id, "runId": rec.run_id}
            )
            with contextlib.suppress(Exception):
                await self.finish(
                    rec, failed("internal", "toolbus failed while running this call; it was logged.")
                )

    async def _attempts(self, rec: CallRecord, reaped: bool, announced: bool) -> dict[str, Any] | None:
        stored = await self._toolsets.get(rec.toolset_id)
        tool = stored.table.get(rec.tool) if stored is not None else None
        if stored is None or tool is None:
            return failed("internal", f"The toolset of this call no longer has tool '{rec.tool}'.")
        attempt = rec.attempts
        if reaped:
            gone = Interrupted(UpstreamUnreachable("The dispatcher running this call stopped mid-call."))
            outcome = after_interruption(gone, attempt=attempt, on_interruption=rec.on_interruption)
            if outcome is not None:
                return outcome
            attempt = await self._next_attempt(rec, attempt)
        timeout = self._timeout(tool)
        allow = tuple(stored.pinned.http.allow) if tool.kind == "http" and stored.pinned.http else ()
        executor = self._executors[tool.kind]
        call_input = rec.input
        while True:
            if announced:
                announced = False
            else:
                await self._events.publish("attemptStarted", rec.run_id, rec.call_id, attempt=attempt)
            try:
                output = await self._run(
                    executor, Attempt(rec, tool, attempt, call_input, timeout, allow, tool.version), tool
                )
                return ok(output)
            except NeedsCredentials as exc:
                await self._park(rec, exc)
                return None
            except Interrupted as exc:
                outcome = after_interruption(exc, attempt=attempt, on_interruption=rec.on_interruption)
                if outcome is not None:
                    return outcome
                attempt = await self._next_attempt(rec, attempt)
            except ToolbusError as exc:
                return failed(exc.code.value, exc.message)

    def _timeout(self, tool: Tool) -> float | None:
        text = tool.policy.timeout
        try:
            return self._timeouts[text]
        except KeyError:
            value = self._timeouts[text] = duration_seconds(text) if text else None
            return value

    @staticmethod
    async def _run(executor: Executor, attempt: Attempt, tool: Tool) -> Any:
        if attempt.timeout is None:
            return await executor.execute(attempt)
        try:
            async with asyncio.timeout(attempt.timeout):
                return await executor.execute(attempt)
        except TimeoutError:
            raise Interrupted(
                Timeout(f"Tool '{tool.name}' gave no answer within {tool.policy.timeout}.")
            ) from None

    async def _next_attempt(self, rec: CallRecord, attempt: int) -> int:
        await asyncio.sleep(backoff(attempt, self._backoff, self._backoff_max) * random.uniform(0.8, 1.2))
        number = await self._store.next_attempt(rec.call_id)
        if number == 0:
            raise _NoLongerOurs
        return number

    async def finish(self, rec: CallRecord, outcome: dict[str, Any]) -> None:
        """Store the outcome, answer waiting invokers, publish `completed`, start the next calls."""
        self._leased.discard(rec.call_id)
        outcome_json = orjson.dumps(outcome).decode()
        result = await self._store.finish(rec.call_id, outcome_json, now_iso())
        if result.status != "done":
            return
        if result.replies:
            body = reply_body(rec.call_id, rec.idempotency_key, outcome)
            for reply in result.replies:
                await self._nc.publish(reply, body)
        await self._events.publish("completed", rec.run_id, rec.call_id, outcome=outcome, now=True)
        if result.admitted:
            self.start(result.admitted)

    async def _park(self, rec: CallRecord, exc: NeedsCredentials) -> None:
        self._leased.discard(rec.call_id)
        now = now_iso()
        result = await self._store.park(rec.call_id, exc.server, exc.level, now)
        if result.status != "parked":
            return
        await self._events.publish(
            "parked", rec.run_id, rec.call_id, server=exc.server, level=exc.level, now=True
        )
        if result.admitted:
            self.start(result.admitted)
        parked = CallParked(
            call_id=rec.call_id,
            run_id=rec.run_id,
            toolset_id=rec.toolset_id,
            namespace=rec.namespace,
            server=exc.server,
            level=exc.level,
            parked_at=now,
        )
        await self._js.publish(self._subjects.internal_calls_park, parked.wire_json())

    # ---- leases ---------------------------------------------------------------------------------

    async def renew_leases(self) -> None:
        """Extend the leases of every call running here; stop the ones that are no longer ours."""
        lost = await self._store.renew(list(self._leased))
        if lost:
            self.stop_local([cid for cid in lost if cid in self._leased])

    async def reap(self) -> int:
        """Claim calls whose owner's lease expired and resume them as interrupted."""
        records = await self._store.reap()
        if records:
            log.warning(
                "claimed calls of a dispatcher that stopped renewing leases",
                extra={"callIds": [r.call_id for r in records][:20], "count": len(records)},
            )
            self.start(records, reaped=True)
        return len(records)

    async def stop(self, grace: float) -> None:
        """Let running calls finish for up to `grace` seconds; the rest are claimed by another
        replica (or this one after restart) once their leases lapse."""
        if self._tasks:
            await asyncio.wait(set(self._tasks.values()), timeout=grace)
        for task in list(self._tasks.values()):
            task.cancel()
