"""The dispatcher's request logic: runs, calls, approval decisions and resumes. No NATS
subscriptions here (see `handlers.py`); every answer is a value or a contract exception."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson
from toolbus_common.canonical import canonical_json, sha256_hex
from toolbus_common.clock import now_iso
from toolbus_common.in_flight import InFlight
from toolbus_common.lru import Lru
from toolbus_common.toolsets import Tool, ToolsetStore
from toolbus_contracts import (
    CallGetReply,
    CallGetRequest,
    CallStartRequest,
    RunCloseReply,
    RunCloseRequest,
    RunOpenReply,
    RunOpenRequest,
    Subjects,
)
from toolbus_contracts.base import unfit_number, unfit_number_error
from toolbus_contracts.errors import Conflict, InvalidInput, InvalidRequest, NotFound, UnknownTool
from toolbus_contracts.internal import ApprovalDecided, ApprovalNeeded, CallsResume
from toolbus_contracts.registry import ApprovalRule

from toolbus_dispatcher.approval_rules import ALWAYS, NEVER, ApprovalRules, Verdict, uses_credentials
from toolbus_dispatcher.calls import CallRunner, reply_body
from toolbus_dispatcher.credentials import CredentialResolver
from toolbus_dispatcher.outcomes import failed
from toolbus_dispatcher.store import CallStore, Created
from toolbus_dispatcher.validation import SchemaCache

log = logging.getLogger(__name__)

PublishReply = Callable[[str, bytes], Awaitable[None]]
"""Publishes a reply body on a subject (the dispatcher's NATS connection)."""

RUNS_CACHED = 10_000
"""Open runs whose owner and deadline are kept in memory (least recently used dropped first)."""
CANCELLED_JSON = orjson.dumps(
    failed("cancelled", "The call's run was closed before the call finished.")
).decode()


def fresh_ids() -> tuple[str, str, str]:
    """Three random ids of 32 hex digits (128 bits each) from one `os.urandom` call: a call's
    idempotency key (when the request gives none), its callId and, for approval, its approvalId.
    One system call instead of a `uuid4` (a `UUID` object and an `os.urandom`) per id."""
    raw = os.urandom(48).hex()
    return raw[:32], raw[32:64], raw[64:]


def _same_call(stored: Created, tool: str, call_input: object) -> bool:
    """Whether the call a repeated key names is this one: the same tool, and the same input as
    JSON values (compared canonically: key order and number spelling aside, `true` is not `1`)."""
    if stored.tool != tool:
        return False
    try:
        return canonical_json(orjson.loads(stored.input_json)) == canonical_json(call_input)
    except (orjson.JSONDecodeError, TypeError, ValueError):
        return False


@dataclass(frozen=True, slots=True)
class Started:
    """A stored call; `outcome_json` is set when it is already done (a repeated key)."""

    call_id: str
    idempotency_key: str
    outcome_json: str | None = None


class DispatcherService:
    def __init__(
        self,
        *,
        store: CallStore,
        toolsets: ToolsetStore,
        runner: CallRunner,
        credentials: CredentialResolver,
        subjects: Subjects,
        run_retention: float,
        publish_reply: PublishReply,
        message_limit: int,
        invokes: InFlight | None = None,
    ) -> None:
        self._store = store
        self.invokes = invokes or InFlight()
        """The `calls.invoke` requests being served here (the event relay publishes after them)."""
        # The approval command and event, a host tool's task and a workflow's start request carry
        # the input: it must fit in one NATS message with their other fields (the server's
        # max_payload less `outputs.ENVELOPE_ROOM`).
        self._message_limit = message_limit
        self._toolsets = toolsets
        self._runner = runner
        self._credentials = credentials
        self._subjects = subjects
        self._retention = run_retention
        self._publish_reply = publish_reply
        self._schemas = SchemaCache()
        self._rules = ApprovalRules()
        self._runs: Lru[str, tuple[str, str | None]] = Lru(RUNS_CACHED)
        self._answering: set[str] = set()
        """Runs a close of this process is closing: another close of them answers no invoker."""

    # ---- runs -----------------------------------------------------------------------------------

    async def open_run(self, req: RunOpenRequest) -> RunOpenReply:
        if await self._toolsets.get(req.toolset_id) is None:
            raise NotFound(
                f"Toolset '{req.toolset_id}' is not registered.", details={"toolsetId": req.toolset_id}
            )
        run_id = req.run_id or f"run_{uuid.uuid4().hex}"
        status = await self._store.open_run(run_id, req.toolset_id, req.namespace, now_iso())
        if status == "conflict":
            raise Conflict(f"Run '{run_id}' is open with another toolset.", details={"runId": run_id})
        if status == "namespace":  # its calls resolve credentials for the namespace it was opened with
            raise Conflict(
                f"Run '{run_id}' is open for another namespace; open a run with a new id.",
                details={"runId": run_id},
            )
        if status == "closed":
            raise Conflict(f"Run '{run_id}' was closed; open a run with a new id.", details={"runId": run_id})
        return RunOpenReply(run_id=run_id)

    async def close_run(self, req: RunCloseRequest) -> RunCloseReply:
        """Close a run; a repeated close (the first reply lost, a client retry) answers the same
        and finishes what the first may not have: the cancelled calls' invokers answered if no
        close answered them yet (once: close_run.lua), run-level credentials deleted. The
        `RunClosed` command is queued by the close script itself, in the outbox, once (message id
        `runClosed:<runId>`)."""
        run_id = req.run_id
        answers = run_id not in self._answering  # else a close of ours is answering them now
        self._answering.add(run_id)
        try:
            closed = await self._store.close_run(run_id, now_iso(), CANCELLED_JSON, self._retention)
            if closed.status == "notFound":
                raise NotFound(f"Run '{run_id}' does not exist.", details={"runId": run_id})
            self._runs.pop(run_id)
            self._runner.stop_local([cid for cid, _, _ in closed.cancelled])
            waited = [entry for entry in closed.cancelled if entry[1]] if answers else []
            for cid, replies, key in waited:
                for reply in replies:
                    await self._publish_reply(reply, reply_body(cid, key, CANCELLED_JSON))
            if waited:
                await self._store.answered([cid for cid, _, _ in waited])
        finally:
            if answers:
                self._answering.discard(run_id)
        await self._credentials.delete_run(run_id)
        return RunCloseReply(run_id=run_id, cancelled=len(closed.cancelled))

    def _check_fits(self, size: int, what: str) -> None:
        """`invalidRequest` naming `input` when what carries it (`size` bytes) would not fit in one
        NATS message with its other fields."""
        if size > self._message_limit:
            raise InvalidRequest(
                f"Field 'input' is too large for {what} would be {size} bytes, over the "
                f"{self._message_limit} that fit in one NATS message with its fields; send a smaller "
                "input (a reference to the data).",
                details={"field": "input", "size": size, "limit": self._message_limit},
            )

    async def _run(self, run_id: str) -> tuple[str, str | None]:
        hit = self._runs.get(run_id)
        if hit is not None:
            return hit
        info = await self._store.run_info(run_id)
        if info is None or info[0] != "open":
            advice = "was closed; open a run with a new id" if info else "is not open; open it with runs.open"
            raise NotFound(f"Run '{run_id}' {advice}.", details={"runId": run_id})
        hit = (info[1], info[2])
        self._runs.put(run_id, hit)
        return hit

    # ---- calls ----------------------------------------------------------------------------------

    async def start_call(self, req: CallStartRequest, reply: str = "", *, run_here: bool = False) -> Started:
        """Check and store a call (`calls.start`, `calls.invoke`); `reply` gets the outcome later.

        With `run_here` (`calls.invoke`), a call admitted at once runs in the caller's task before
        this returns, counted in `invokes` meanwhile.
        """
        if not run_here:
            return await self._start_call(req, reply, run_here=False)
        self.invokes.enter()
        try:
            return await self._start_call(req, reply, run_here=True)
        finally:
            self.invokes.leave()

    async def _start_call(self, req: CallStartRequest, reply: str, *, run_here: bool) -> Started:
        toolset_id, namespace = await self._run(req.run_id)
        stored = await self._toolsets.get(toolset_id)
        tool = stored.table.get(req.tool) if stored is not None else None
        if tool is None:
            raise UnknownTool(f"Tool '{req.tool}' is not in this run's toolset.", details={"tool": req.tool})
        await self._schemas.validate(toolset_id, tool.name, tool.info.input_schema, req.input)
        fresh_key, fresh_call, fresh_approval = fresh_ids()
        key = req.idempotency_key or fresh_key
        call_id = "call_" + fresh_call
        policy = tool.policy
        now = now_iso()
        approval_id = digest = ""
        announce: tuple[str, bytes] | None = None
        verdict = await self._approval_verdict(req, tool, toolset_id, namespace)
        if verdict.ask:
            approval_id, digest = "apr_" + fresh_approval, sha256_hex(req.input)
            # The approval command goes into the outbox with the stored call (message id
            # `approvalNeeded:<callId>`): a dispatcher dying right after the store can no longer
            # leave the call waiting with the approval service never told.
            needed = ApprovalNeeded.model_construct(  # every field is checked (the input by its schema)
                approval_id=approval_id,
                call_id=call_id,
                run_id=req.run_id,
                namespace=namespace,
                toolset_id=toolset_id,
                tool=tool.name,
                input=req.input,
                input_digest=digest,
                requested_at=now,
                timeout=policy.approval_timeout,
                rule_error=verdict.error,
            )
            command = needed.wire_json()
            self._check_fits(len(command), "an approval: its request")
            announce = (self._subjects.internal_approval_requests, command)
        try:
            input_json = orjson.dumps(req.input).decode()
        except TypeError:  # an integer outside 64 bits: the store, events and tools could not carry it
            raise unfit_number_error(unfit_number(req.input, ("input",)) or "input") from None
        if tool.kind in ("host", "workflow"):
            carrier = "its task" if tool.kind == "host" else "its start request"
            self._check_fits(len(input_json), f"'{tool.name}': {carrier}, carrying the input,")
        for _ in range(2):
            created = await self._store.create_call(
                call_id=call_id,
                run_id=req.run_id,
                idempotency_key=key,
                tool=tool.name,
                input_json=input_json,
                toolset_id=toolset_id,
                namespace=namespace,
                concurrency=policy.concurrency,
                on_interruption=policy.on_interruption,
                reply=reply,
                now=now,
                approval_id=approval_id,
                digest=digest,
                announce=announce,
            )
            if created.status != "differs" or not _same_call(created, tool.name, req.input):
                break
            # The same call, its input written otherwise (another key order): ask with the text
            # stored, so that the script finds it the same and registers this invoker.
            input_json = created.input_json
        self._credentials.observe_version(created.cred_version)
        if created.status == "differs":
            raise Conflict(
                f"Idempotency key '{key}' already names call '{created.call_id}' of this run, made "
                f"with another {'tool' if created.tool != tool.name else 'input'}; a new call needs a new key.",
                details={"idempotencyKey": key, "callId": created.call_id},
            )
        if created.status == "exists":
            # (A call awaiting approval had its approval command queued by the first create.)
            if created.admitted:  # the first create's reply was lost: nobody runs these yet
                self._runner.start(created.admitted)
            return Started(created.call_id, key, created.outcome_json if created.state == "done" else None)
        if created.status != "created":
            self._runs.pop(req.run_id)
            raise NotFound(
                f"Run '{req.run_id}' is not open; open it with runs.open.", details={"runId": req.run_id}
            )
        mine = next((r for r in created.admitted if r.call_id == call_id), None)
        if mine is not None and run_here:
            self._runner.start([r for r in created.admitted if r is not mine])
            assert stored is not None  # the tool was found in it above
            await self._runner.run_here(mine, (stored, tool), req.input)
        elif created.admitted:
            self._runner.start(created.admitted)
        return Started(call_id, key)

    async def _approval_verdict(
        self, req: CallStartRequest, tool: Tool, toolset_id: str, namespace: str | None
    ) -> Verdict:
        """Whether this call waits for a decision: its tool's `approval`, a rule evaluated here."""
        approval = tool.policy.approval
        if not isinstance(approval, ApprovalRule):
            return ALWAYS if approval else NEVER
        level: str | None = None
        if tool.kind == "mcp" and uses_credentials(approval):
            try:
                _, level = await self._credentials.resolve(toolset_id, namespace, req.run_id, tool.target)
            except Exception as exc:  # the credentials store away: a person decides instead
                return Verdict(True, f"the credentials level could not be read ({type(exc).__name__})")
        run = {"runId": req.run_id, "namespace": namespace, "toolsetId": toolset_id, "credentials": level}
        return self._rules.verdict(approval, {"input": req.input, "tool": tool.name, "run": run})

    async def get_call(self, req: CallGetRequest) -> CallGetReply:
        found = await self._store.get_call(req.call_id)
        if found is None:
            raise NotFound(f"Call '{req.call_id}' does not exist.", details={"callId": req.call_id})
        state, attempts, outcome = found
        return CallGetReply.model_construct(
            call_id=req.call_id,
            state=state,  # type: ignore[arg-type]  # written only by the scripts, always a CallState
            attempts=max(0, attempts),
            outcome=orjson.loads(outcome) if outcome else None,
        )

    # ---- decisions from other services -----------------------------------------------------------

    async def apply_decision(self, decision: ApprovalDecided) -> None:
        """Apply an approval decision if the call still waits for exactly this one."""
        match = (decision.approval_id, decision.tool, decision.toolset_id, decision.input_digest)
        now = now_iso()
        decider = decision.decider or ""
        problem = None
        if decision.decision == "approved":
            edited = None
            if decision.input is not None:
                edited, problem = await self._edited(decision)
            if problem is None:
                result = await self._store.release_waiting(
                    decision.call_id,
                    "awaitingApproval",
                    now=now,
                    approval=match,
                    edited=edited,
                    decider=decider,
                )
                if result.status in ("queued", "skipped"):  # skipped: a repeat may hand calls back
                    self._runner.start(result.admitted)
                return
        reason = problem or decision.reason
        outcome = failed("denied", reason or "The call was denied.")
        result = await self._store.release_waiting(
            decision.call_id,
            "awaitingApproval",
            outcome_json=orjson.dumps(outcome).decode(),
            now=now,
            approval=match,
            reason=reason or "",
            decider=decider,
        )
        if result.status == "done":
            await self._end_held(decision.call_id, result.run_id, result.replies, result.key, outcome)

    async def _edited(self, decision: ApprovalDecided) -> tuple[tuple[str, str] | None, str | None]:
        """(input JSON, digest) of an approval's edited input, or why it cannot be sent (the
        approval service checked it against the same schema; this holds if the toolset is gone)."""
        edited = decision.input
        assert edited is not None
        stored = await self._toolsets.get(decision.toolset_id)
        tool = stored.table.get(decision.tool) if stored is not None else None
        if tool is None:
            return None, "The edited input could not be checked: the tool is no longer known."
        try:
            self._schemas.check(decision.toolset_id, tool.name, tool.info.input_schema, edited)
        except InvalidInput as exc:
            return None, f"The edited input is invalid: {exc.message}"
        text = orjson.dumps(edited).decode()
        if len(text) > self._message_limit:
            return (
                None,
                f"The edited input is {len(text)} bytes, over the {self._message_limit} a call carries.",
            )
        return (text, sha256_hex(edited)), None

    async def apply_resume(self, resume: CallsResume) -> None:
        """Send parked calls again in order, or end them with `credentialsRejected`."""
        await self._credentials.refresh()
        for call_id in resume.call_ids:
            now = now_iso()
            if resume.reason == "credentialsRejected":
                outcome = failed(
                    "credentialsRejected",
                    "The server kept rejecting the credentials and no new ones were set in time.",
                )
                result = await self._store.release_waiting(
                    call_id, "parked", outcome_json=orjson.dumps(outcome).decode(), now=now
                )
                if result.status == "done":
                    await self._end_held(call_id, result.run_id, result.replies, result.key, outcome)
                continue
            result = await self._store.release_waiting(call_id, "parked", now=now)
            if result.status in ("queued", "skipped"):  # skipped: a repeat may hand calls back
                self._runner.start(result.admitted)

    async def _end_held(
        self, call_id: str, run_id: str, replies: list[str], key: str, outcome: dict[str, object]
    ) -> None:
        for reply in replies:
            await self._publish_reply(reply, reply_body(call_id, key, outcome))
