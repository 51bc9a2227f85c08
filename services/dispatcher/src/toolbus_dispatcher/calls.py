"""Running the calls this dispatcher owns: attempts under the tool's policy, outcomes, slot
hand-over, lease renewal, and claiming the calls of dispatchers that died.

A call reaches `CallRunner.start` only once a script made it `running` and owned by this process
(admitted into a slot, or claimed from an expired lease). From then on this module is the only
writer of that call until its outcome is stored, it is parked, or it is no longer ours (another
replica claimed it after our lease lapsed, or its run was closed); then its task just stops.

A backing store that does not answer (Redis restarting, JetStream away) is never a call's outcome:
each store step of a call is retried with backoff until it goes through (`_persist`), and lease
renewal is retried, each attempt bounded in time, until the leases could lapse. Events are
written by the store's scripts with the state change (see `events.py`); nothing here publishes one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import orjson
from toolbus_common.bus import RawJson, encode_error, encode_ok
from toolbus_common.clock import now_iso
from toolbus_common.faults import is_backing_store_fault, is_redis_fault
from toolbus_common.integrity import StoredCopyAltered
from toolbus_common.outages import REDIS
from toolbus_common.toolsets import StoredToolset, Tool, ToolsetStore
from toolbus_contracts import Subjects, ToolbusError, duration_seconds
from toolbus_contracts.errors import Internal, Timeout, UpstreamUnreachable
from toolbus_contracts.internal import CallParked
from toolbus_contracts.registry import ToolKind

from toolbus_dispatcher.deadline import within
from toolbus_dispatcher.executors.base import Attempt, Executor, Interrupted, NeedsCredentials
from toolbus_dispatcher.outcomes import after_interruption, backoff, failed, ok
from toolbus_dispatcher.output_memory import Lease, OutputMemory
from toolbus_dispatcher.outputs import OutputStore
from toolbus_dispatcher.records import CallRecord
from toolbus_dispatcher.store import CallStore

log = logging.getLogger(__name__)

T = TypeVar("T")

PublishReply = Callable[[str, bytes], Awaitable[None]]
"""The service's guarded reply publish (`Bus.reply`): too large → `outputTooLarge`, publish
failed → `unavailable` sent once more; never silence."""


class _NoLongerOurs(Exception):
    """The call was claimed by another replica or ended by its run's close."""


def invoke_data(call_id: str, key: str, outcome: Any) -> RawJson:
    """The `data` of a `calls.invoke` reply; `outcome` is a dict or its stored JSON text (spliced in
    as it is, not parsed again)."""
    outcome_json = outcome.encode() if isinstance(outcome, str) else orjson.dumps(outcome)
    return RawJson(
        b'{"callId":%s,"idempotencyKey":%s,"outcome":%s}'
        % (orjson.dumps(call_id), orjson.dumps(key), outcome_json)
    )


def reply_body(call_id: str, key: str, outcome: Any) -> bytes:
    """The whole `calls.invoke` success reply, in the bus's one envelope."""
    return encode_ok(invoke_data(call_id, key, outcome))


class CallRunner:
    """Owns the running calls of this process."""

    def __init__(
        self,
        *,
        store: CallStore,
        toolsets: ToolsetStore,
        executors: Mapping[ToolKind, Executor],
        outputs: OutputStore,
        publish_reply: PublishReply,
        subjects: Subjects,
        retry_backoff: float,
        retry_backoff_max: float,
        memory: OutputMemory | None = None,
    ) -> None:
        """`memory`: the bound on large outputs in flight (each call leases its share of it, held
        until its outcome is stored); None: no bound."""
        self._store = store
        self._memory = memory
        self._toolsets = toolsets
        self._executors = executors
        self._outputs = outputs
        self._publish_reply = publish_reply
        self._subjects = subjects
        self._backoff = retry_backoff
        self._backoff_max = retry_backoff_max
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._leased: set[str] = set()
        self._finishing: set[str] = set()
        """Calls whose outcome is being stored, or that are being parked and announced: a
        renewal that finds them no longer running (the script already took their lease) never
        cancels them."""
        self._timeouts: dict[str | None, float | None] = {None: None}
        self._loop: asyncio.AbstractEventLoop | None = None
        """The event loop the calls run on, taken once (each `get_running_loop()` is a `getpid`)."""
        self._renewed_at = time.monotonic()
        """When the last renewal that went through was sent: every lease held here runs at least
        a lease from then (a call admitted later got its lease at admission)."""

    # ---- admission ------------------------------------------------------------------------------

    def start(self, records: list[CallRecord], *, reaped: bool = False) -> None:
        """Run calls a script just made ours (admitted, or claimed from a dead owner), each in a
        task of its own."""
        for rec in records:
            if rec.call_id in self._tasks:
                continue  # our own lease lapsed and we claimed it back: it is still running here
            self._leased.add(rec.call_id)
            task = self.loop.create_task(self._drive(rec, reaped), name=f"call-{rec.call_id}")
            self._tasks[rec.call_id] = task
            task.add_done_callback(self._done_callback(rec.call_id))

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    async def run_here(
        self, rec: CallRecord, known: tuple[StoredToolset, Tool] | None = None, call_input: Any = None
    ) -> None:
        """Run a just-admitted call in the current task (a `calls.invoke` handler): one task less.
        `known`: the toolset and tool the handler just looked up, and `call_input` the parsed input
        (not read back from the record's JSON)."""
        task = asyncio.current_task(self.loop)
        assert task is not None
        if rec.call_id in self._tasks:
            return  # handed over again by a retried script and already running in a task
        self._leased.add(rec.call_id)
        self._tasks[rec.call_id] = task
        try:
            await self._drive(rec, False, known, call_input)
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

    async def _drive(
        self,
        rec: CallRecord,
        reaped: bool,
        known: tuple[StoredToolset, Tool] | None = None,
        call_input: Any = None,
    ) -> None:
        lease = self._memory.lease() if self._memory is not None else None
        try:
            outcome = await self._attempts(rec, reaped, known, call_input, lease)
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
        finally:
            if lease is not None:
                lease.release()

    async def _persist(self, rec: CallRecord, what: str, step: Callable[[], Awaitable[T]]) -> T:
        """Run one store step of a call until it goes through: a backing-store fault is waited
        out with backoff (0.05 s doubling to 2 s), never made the call's outcome."""
        pause = 0.05
        while True:
            try:
                return await step()
            except Exception as exc:
                if not is_backing_store_fault(exc):
                    raise
                if is_redis_fault(exc):
                    REDIS.fault(exc)
                else:
                    log.warning(
                        f"{what}: a backing store did not answer; trying again",
                        extra={"callId": rec.call_id, "error": type(exc).__name__},
                    )
            await asyncio.sleep(pause * random.uniform(0.8, 1.2))
            pause = min(pause * 2, 2.0)

    async def _attempts(
        self,
        rec: CallRecord,
        reaped: bool,
        known: tuple[StoredToolset, Tool] | None = None,
        call_input: Any = None,
        lease: Lease | None = None,
    ) -> dict[str, Any] | None:
        if known is not None:
            stored, tool = known
        else:
            try:
                found = await self._persist(
                    rec, "reading the toolset", lambda: self._toolsets.get(rec.toolset_id)
                )
            except StoredCopyAltered as exc:  # logged by the store
                return failed(exc.code.value, exc.message)
            listed = found.table.get(rec.tool) if found is not None else None
            if found is None or listed is None:
                return failed("internal", f"The toolset of this call no longer has tool '{rec.tool}'.")
            stored, tool = found, listed
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
        if call_input is None:
            call_input = rec.input
        reserve = lease.reserve if lease is not None else None
        while True:
            if lease is not None:
                lease.release(close=False)  # an earlier attempt's answer is dropped
            try:
                output = await self._run(
                    executor,
                    Attempt(rec, tool, attempt, call_input, timeout, allow, tool.version, reserve=reserve),
                    tool,
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

    async def _run(self, executor: Executor, attempt: Attempt, tool: Tool) -> Any:
        try:
            if attempt.timeout is None:
                return await executor.execute(attempt)
            return await within(self.loop, attempt.timeout, executor.execute(attempt))
        except TimeoutError:
            raise Interrupted(
                Timeout(f"Tool '{tool.name}' gave no answer within {tool.policy.timeout}."),
                sent=attempt.progress.sending,  # False: timed out before sending (credentials)
            ) from None
        except (ToolbusError, Interrupted, NeedsCredentials):
            raise
        except Exception as exc:
            if not is_backing_store_fault(exc):
                raise
            if not attempt.progress.sending:
                raise Interrupted(
                    UpstreamUnreachable(f"A backing store failed before '{tool.name}' was sent."),
                    sent=False,
                ) from None
            # NATS went away mid-attempt (host tools, workflows): the task may have left.
            raise Interrupted(
                UpstreamUnreachable(f"The message bus failed during the attempt of '{tool.name}'.")
            ) from None

    async def _next_attempt(self, rec: CallRecord, attempt: int) -> int:
        await asyncio.sleep(backoff(attempt, self._backoff, self._backoff_max) * random.uniform(0.8, 1.2))
        number = await self._persist(
            rec, "counting an attempt", lambda: self._store.next_attempt(rec.call_id, now_iso())
        )
        if number == 0:
            raise _NoLongerOurs
        return number

    async def finish(self, rec: CallRecord, outcome: dict[str, Any]) -> None:
        """Store the outcome (its output by reference when too large to travel inline) with its
        `completed` event, answer waiting invokers, start the next calls."""
        self._finishing.add(rec.call_id)
        try:
            outcome_json, outcome = await self._persist(
                rec, "storing a large output", lambda: self._outputs.outcome_json(rec.call_id, outcome)
            )
            now = now_iso()
            result = await self._persist(
                rec, "storing an outcome", lambda: self._store.finish(rec.call_id, outcome_json, now)
            )
        finally:
            self._finishing.discard(rec.call_id)
            self._leased.discard(rec.call_id)
        if result.status != "done":
            return
        if result.admitted:  # before any await: these are ours and nobody else starts them
            self.start(result.admitted)
        if result.replies:
            try:
                body = reply_body(rec.call_id, rec.idempotency_key, outcome_json)
            except Exception:  # a bug: the stored outcome is JSON text already
                log.exception("invoke reply is not serializable", extra={"callId": rec.call_id})
                body = encode_error(Internal("toolbus built a reply it cannot encode; it was logged."))
            for reply in result.replies:  # each waiting invoker gets exactly one reply
                await self._publish_reply(reply, body)

    async def _park(self, rec: CallRecord, exc: NeedsCredentials) -> None:
        """Park the call; the script also puts its CallParked command in the outbox (the relay
        publishes it), so a crash right after parking cannot leave the call parked unannounced.

        Parking ends the lease in the script: a renewal sent meanwhile reports the call lost,
        possibly before the park's own reply is read. The task is not cancelled for that (it is
        in `_finishing`), so the calls the park admitted are started."""
        self._finishing.add(rec.call_id)
        try:
            now = now_iso()
            parked = CallParked(
                call_id=rec.call_id,
                run_id=rec.run_id,
                toolset_id=rec.toolset_id,
                namespace=rec.namespace,
                server=exc.server,
                level=exc.level,
                parked_at=now,
                credentials_version=exc.version,
                required_scopes=None if exc.scopes is None else list(exc.scopes),
            )
            announce = (self._subjects.internal_calls_park, parked.wire_json())
            result = await self._persist(
                rec,
                "parking a call",
                lambda: self._store.park(rec.call_id, exc.server, exc.level, now, announce=announce),
            )
        finally:
            self._finishing.discard(rec.call_id)
            self._leased.discard(rec.call_id)
        if result.status == "parked" and result.admitted:
            self.start(result.admitted)

    # ---- leases ---------------------------------------------------------------------------------

    async def renew_leases(self) -> None:
        """Extend the leases of every call running here; stop the ones that are no longer ours.

        Runs every third of a lease. A failed renewal is retried with backoff until a third of a
        lease after the leases the last good one extended would lapse (an attempt whose answer
        was lost may have extended them further), and each attempt is bounded (`asyncio.timeout`)
        by a quarter of the lease and the time left: redis-py alone waits
        `TOOLBUS_REDIS_SOCKET_TIMEOUT` (a whole lease by default) on a connection gone silent, so
        one stuck attempt outlasted the lease; bounded, it is given up (redis-py drops that
        connection) and sent again on another, so a renewal goes through within about a quarter
        of a lease of Redis answering again. Raises the last error if none went through (the
        next period tries again)."""
        lease = self._store.lease
        deadline = max(self._renewed_at + lease, time.monotonic()) + lease / 3
        pause = 0.05
        while True:
            sent = time.monotonic()
            try:
                async with asyncio.timeout(max(0.0, min(lease / 4, deadline - sent))):
                    lost = await self._store.renew(list(self._leased))
                break
            except Exception as exc:
                retryable = isinstance(exc, TimeoutError) or is_backing_store_fault(exc)
                if not retryable or time.monotonic() + pause >= deadline:
                    raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)
        self._renewed_at = sent
        if lost:
            self.stop_local([cid for cid in lost if cid in self._leased and cid not in self._finishing])

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
