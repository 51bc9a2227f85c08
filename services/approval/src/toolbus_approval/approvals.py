"""What the approval service does, with no NATS in it: store an approval once, announce it once,
let exactly one decision (or the expiry, or the run closing) end it, and hand every decision to the
dispatcher (each written to the service's outbox by the change itself, `ApprovalStore`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from toolbus_common.canonical import sha256_hex
from toolbus_common.cursors import opaque, unopaque
from toolbus_contracts.approvals import (
    REMEMBER_MAX_SECONDS,
    ApprovalDecideReply,
    ApprovalRecord,
    ApprovalRequested,
    ApprovalsHistoryRequest,
    Remember,
    RememberedDecision,
)
from toolbus_contracts.base import parse_duration, unfit_number, unfit_number_error
from toolbus_contracts.errors import Conflict, InvalidRequest, NotFound
from toolbus_contracts.internal import ApprovalNeeded

from toolbus_approval.edits import EditCheck
from toolbus_approval.identity import ANONYMOUS, Identity
from toolbus_approval.remembered import RememberedStore, new_remembered_id
from toolbus_approval.store import (
    CANCELLED_REASON,
    EXPIRED_REASON,
    ApprovalStore,
    DecideResult,
    Position,
    State,
    StoredApproval,
    epoch_ms,
)

log = logging.getLogger(__name__)

_CHUNK = 200
"""Approvals read from Redis per round trip while a page is filled."""
EDIT_ROOM = 12 * 1024
"""Bytes below `list_budget` an edited input must stay: with the list's 4 KiB, the 16 KiB the
dispatcher keeps around an input it sends to a host tool or workflow (`outputs.ENVELOPE_ROOM`)."""
HISTORY_SCAN_MAX = 5000
"""Decisions one `approvals.history` page reads at most, whatever its filters match."""
REMEMBERED_DECIDER = "remembered:"
"""The decider of a call decided by a remembered decision: this, then the remembered id."""
EXPIRY_DECIDER = "toolbus:expiry"
"""The decider recorded when an approval's timeout denied it."""


def encode_cursor(after: Position) -> str:
    """The opaque `nextCursor` of a page: where the next one starts."""
    ms, approval_id = after
    return opaque(f"{ms}:{approval_id}")


def decode_cursor(cursor: str | None) -> Position | None:
    """The place a `cursor` from `encode_cursor` stands for, or `invalidRequest` naming `cursor`."""
    if cursor is None:
        return None
    try:
        ms, sep, approval_id = unopaque(cursor).partition(":")  # stray padding, a newline: refused
        if not (sep and ms.isascii() and ms.isdigit() and approval_id) or str(int(ms)) != ms:
            raise ValueError  # `01`: not as approvals.list writes it
    except ValueError:
        raise InvalidRequest(
            "Field 'cursor' is not a cursor approvals.list gave; list again without one.",
            details={"field": "cursor"},
        ) from None
    return int(ms), approval_id


class Approvals:
    """The approval logic over an `ApprovalStore`. Safe with several replicas: every transition is
    one atomic script in Redis, and outbound messages are retried from durable queues."""

    def __init__(
        self,
        store: ApprovalStore,
        *,
        announced: Callable[[], None] = lambda: None,
        timeout: timedelta | None = None,
        list_budget: int,
        edits: EditCheck | None = None,
        identity: Identity | None = None,
        remembered: RememberedStore | None = None,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self._store = store
        self.list_budget = list_budget
        """Bytes of approvals one `approvals.list` reply may hold: the connection's max_payload
        less room for the envelope and the cursor."""
        self._announced = announced
        """Told after an approval was stored with its announcement (the webhook sender looks)."""
        self._timeout_ms = None if timeout is None else int(timeout.total_seconds() * 1000)
        self._now_ms = clock_ms
        self._edits = edits
        self.identity = identity or Identity()
        self._remembered = remembered
        """How a decision's decider is named (read by the decide handler)."""

    # ---- commands from the dispatcher ------------------------------------------------------------

    async def request(self, needed: ApprovalNeeded) -> bool:
        """Store the approval with its announcement, or decide it at once when a remembered
        decision covers it (then it is not announced). Idempotent on the approval id: a redelivered
        command creates nothing and announces nothing again, unless it finds the approval pending
        and never announced with no remembered decision now. True when this call created it."""
        now = self._now_ms()
        timeout_ms = self._timeout_ms
        if needed.timeout is not None:  # the tool's own approvalTimeout
            timeout_ms = int(parse_duration(needed.timeout).total_seconds() * 1000)
        expires = None if timeout_ms is None else epoch_ms(needed.requested_at) + timeout_ms
        remembered = await self._remembered_for(needed)
        result = await self._store.create(needed, expires_ms=expires, now_ms=now, announce=remembered is None)
        if result.created:
            log.info(
                "approval requested",
                extra={"approvalId": needed.approval_id, "callId": needed.call_id, "runId": needed.run_id},
            )
        elif result.state == "cancelled":
            log.info("approval for a closed run cancelled", extra={"approvalId": needed.approval_id})
        elif result.announced:
            log.info("approval announced late", extra={"approvalId": needed.approval_id})
        if result.announced:
            self._announced()
        if remembered is not None and result.state == "pending":
            # Also on a redelivery: a crash may have come between storing it and deciding it.
            await self._decide_remembered(needed, remembered)
        return result.created

    async def close_run(self, run_id: str) -> int:
        """Cancel the run's pending approvals (no decision is sent: the dispatcher already ended its
        calls) and make any approval of this run that arrives later start cancelled."""
        cancelled = 0
        for approval_id in await self._store.mark_run_closed(run_id):
            result = await self._transition(approval_id, "cancelled", CANCELLED_REASON)
            cancelled += result.outcome == "ok"
        if cancelled:
            log.info("run closed: approvals cancelled", extra={"runId": run_id, "cancelled": cancelled})
        return cancelled

    # ---- requests from people ------------------------------------------------------------------

    async def pending(
        self,
        *,
        run_id: str | None,
        namespace: str | None,
        after: Position | None = None,
        limit: int,
        budget: int,
    ) -> tuple[list[ApprovalRequested], Position | None]:
        """One page of pending approvals, oldest request first, of one run and/or namespace (all
        without), after `after`: at most `limit`, and as many as fit in `budget` bytes of JSON (at
        least one); with the place the next page starts after, or None when none is left."""
        page: list[ApprovalRequested] = []
        used = 0
        while True:
            chunk = min(limit - len(page) + 1, _CHUNK)  # one more than fits: is there a next page?
            rows = await self._store.pending_ids(run_id=run_id, namespace=namespace, after=after, count=chunk)
            for stored in await self._store.get_many([approval_id for _, approval_id in rows]):
                if stored.state != "pending" or (
                    namespace is not None and stored.needed.namespace != namespace
                ):
                    continue  # decided since it was indexed; or of the run, but another namespace
                approval = stored.requested()
                size = len(orjson.dumps(approval.wire())) + 1
                if len(page) == limit or (page and used + size > budget):
                    last = page[-1]
                    return page, (epoch_ms(last.requested_at), last.approval_id)
                page.append(approval)
                used += size
            if len(rows) < chunk:
                return page, None
            after = rows[-1]

    async def _remembered_for(self, needed: ApprovalNeeded) -> RememberedDecision | None:
        """The remembered decision in force for the approval's namespace, tool (and input), if any."""
        if self._remembered is None:
            return None
        return await self._remembered.match(needed.namespace, needed.tool, needed.input_digest)

    async def _decide_remembered(self, needed: ApprovalNeeded, found: RememberedDecision) -> None:
        """Decide a new approval at once by a remembered decision; the decider says which
        (`remembered:<rememberedId>`)."""
        state: State = "approved" if found.decision == "approved" else "denied"
        decider = f"{REMEMBERED_DECIDER}{found.remembered_id}"
        result = await self._transition(needed.approval_id, state, found.reason, decider=decider)
        if result.outcome == "ok":
            log.info(
                "approval decided by a remembered decision",
                extra={"approvalId": needed.approval_id, "rememberedId": found.remembered_id},
            )

    async def remember(
        self,
        approval_id: str,
        remember: Remember,
        *,
        decision: State,
        reason: str | None,
        decider: str | None,
    ) -> str:
        """Remember a decision just made on `approval_id` for its namespace and tool."""
        assert self._remembered is not None
        stored = await self._store.get(approval_id)
        assert stored is not None  # decided a moment ago; kept 30 days
        n = stored.needed
        now = self._now_ms()
        expires = now + int(parse_duration(remember.for_).total_seconds() * 1000)
        remembered = RememberedDecision(
            remembered_id=new_remembered_id(),
            namespace=n.namespace,
            tool=n.tool,
            input_digest=n.input_digest if remember.same_input else None,
            decision="approved" if decision == "approved" else "denied",
            reason=reason,
            decider=decider or ANONYMOUS,
            approval_id=approval_id,
            created_at=iso_of(now),
            expires_at=iso_of(expires),
        )
        await self._remembered.put(remembered, expires_ms=expires)
        log.info(
            "decision remembered", extra={"rememberedId": remembered.remembered_id, "approvalId": approval_id}
        )
        return remembered.remembered_id

    async def get(self, approval_id: str) -> StoredApproval | None:
        """One approval as stored, whatever its state; None when unknown (or long gone)."""
        return await self._store.get(approval_id)

    async def remembered(self, remembered_id: str) -> RememberedDecision | None:
        """One remembered decision in force, or None."""
        return None if self._remembered is None else await self._remembered.get(remembered_id)

    async def remembered_in_force(
        self, *, namespace: str | None, tool: str | None, limit: int
    ) -> tuple[list[RememberedDecision], bool]:
        if self._remembered is None:
            return [], False
        return await self._remembered.in_force(self._now_ms(), namespace=namespace, tool=tool, limit=limit)

    async def revoke(self, remembered_id: str) -> None:
        """Forget a remembered decision; `NotFound` when none is in force under that id."""
        if self._remembered is None or not await self._remembered.revoke(remembered_id):
            raise NotFound(
                f"No remembered decision {remembered_id!r} in force: it expired, was revoked, or never was.",
                details={"rememberedId": remembered_id},
            )

    async def decide(
        self,
        approval_id: str,
        *,
        approve: bool,
        reason: str | None,
        edited_input: dict[str, Any] | None = None,
        decider: str | None = None,
        remember: Remember | None = None,
    ) -> ApprovalDecideReply:
        """Record the first decision on a pending approval and send it to the dispatcher. Raises
        `NotFound` for an unknown id and `Conflict` (saying what came first) for a second one; an
        edited input that the tool's schema refuses, or that would not fit in the decision, is
        `invalidRequest` naming `input` (nothing is decided)."""
        state: State = "approved" if approve else "denied"
        if edited_input is not None:
            await self.check_edit(approval_id, approve, edited_input)
        if remember is not None:
            _check_remember(remember, edited=edited_input is not None, enabled=self._remembered is not None)
        result = await self._transition(
            approval_id, state, reason, edited_input=edited_input, decider=decider
        )
        if result.outcome == "missing":
            raise NotFound(
                f"No approval {approval_id!r}: use an id from approvals.list or an approval.requested event.",
                details={"approvalId": approval_id},
            )
        if result.outcome == "taken":
            raise Conflict(_conflict_message(approval_id, result), details=_conflict_details(result))
        log.info("approval decided", extra={"approvalId": approval_id, "decision": state, "decider": decider})
        remembered_id = None
        if remember is not None:
            remembered_id = await self.remember(
                approval_id, remember, decision=state, reason=reason, decider=decider
            )
        return ApprovalDecideReply(
            approval_id=approval_id,
            decision="approved" if approve else "denied",
            edited_input_digest=None if edited_input is None else sha256_hex(edited_input),
            remembered_id=remembered_id,
        )

    async def check_edit(self, approval_id: str, approve: bool, edited: dict[str, Any]) -> None:
        """Raise `invalidRequest` naming `input` when `decide` would refuse this edited input
        (what the console checks as a person types)."""
        if not approve:
            raise InvalidRequest(
                "Field 'input' goes with approve: true (an edited input to send); a denial sends nothing.",
                details={"field": "input"},
            )
        try:
            size, limit = len(orjson.dumps(edited)), self.list_budget - EDIT_ROOM
        except TypeError:  # an integer outside 64 bits: no event or tool could carry it
            raise unfit_number_error(unfit_number(edited, ("input",)) or "input") from None
        if size > limit:
            raise InvalidRequest(
                f"Field 'input' is {size} bytes, over the {limit} a decision (and the call it sends) "
                "carries in one NATS message.",
                details={"field": "input", "size": size, "limit": limit},
            )
        stored = await self._store.get(approval_id)
        if stored is None:
            return  # the transition answers notFound
        if self._edits is None:
            raise InvalidRequest(
                "Field 'input': this approval service cannot check edited inputs.", details={"field": "input"}
            )
        await self._edits.check(stored.needed.toolset_id, stored.needed.tool, edited)

    async def history(
        self, request: ApprovalsHistoryRequest, *, scan_max: int = HISTORY_SCAN_MAX
    ) -> tuple[list[ApprovalRecord], Position | None]:
        """One page of decisions, newest first, that match every filter the request gives; with
        the place the next page starts before (None when the index is exhausted). At most
        `scan_max` decisions are read per page: a rare match returns a short page and a cursor."""
        since_ms = _moment(request.since, "since")
        until_ms = _moment(request.until, "until")
        before = decode_cursor(request.cursor)
        if until_ms is not None and (before is None or before[0] >= until_ms):
            before = (until_ms, "")  # strictly before `until`
        page: list[ApprovalRecord] = []
        scanned = 0
        while scanned < scan_max:
            count = min(_CHUNK, scan_max - scanned)
            rows = await self._store.decided_ids(before=before, since_ms=since_ms, count=count)
            scanned += len(rows)
            for position, stored in zip(rows, await self._store.get_rows([i for _, i in rows]), strict=True):
                if stored is None or not _matches(stored, request):
                    continue
                page.append(_record(stored))
                if len(page) == request.limit:
                    return page, position
            if len(rows) < count:
                return page, None
            before = rows[-1]
        return page, before

    # ---- background duties ---------------------------------------------------------------------

    async def expire_due(self) -> int:
        """Deny, with reason `expired`, every pending approval past its deadline. Replicas may run
        this together: the atomic transition lets exactly one of them (or a person) win."""
        expired = 0
        for approval_id in await self._store.due_expiries(self._now_ms()):
            result = await self._transition(approval_id, "denied", EXPIRED_REASON, decider=EXPIRY_DECIDER)
            if result.outcome == "ok":
                expired += 1
                log.info("approval expired", extra={"approvalId": approval_id})
            elif result.outcome == "missing":
                await self._store.drop_expiry(approval_id)
        return expired

    async def _transition(
        self,
        approval_id: str,
        state: State,
        reason: str | None,
        *,
        edited_input: dict[str, Any] | None = None,
        decider: str | None = None,
    ) -> DecideResult:
        now_ms = self._now_ms()
        result = await self._store.transition(
            approval_id,
            state,
            reason,
            decided_at=iso_of(now_ms),  # the same instant as the history index's score
            now_ms=now_ms,
            edited_input=edited_input,
            decider=decider,
        )
        return result


def _check_remember(remember: Remember, *, edited: bool, enabled: bool) -> None:
    if not enabled:
        raise InvalidRequest(
            "Field 'remember': this approval service keeps no remembered decisions.",
            details={"field": "remember"},
        )
    if edited:
        raise InvalidRequest(
            "Field 'remember' cannot go with an edited 'input': a remembered decision sends each call's own input.",
            details={"field": "remember"},
        )
    seconds = parse_duration(remember.for_).total_seconds()
    if not 0 < seconds <= REMEMBER_MAX_SECONDS:
        raise InvalidRequest(
            f"Field 'remember.for' must be more than 0 and at most {REMEMBER_MAX_SECONDS // 86400} days.",
            details={"field": "remember.for"},
        )


def iso_of(ms: int) -> str:
    """RFC 3339 with milliseconds and `Z` (as `now_iso` writes) of epoch milliseconds."""
    moment = datetime.fromtimestamp(ms // 1000, UTC).replace(microsecond=ms % 1000 * 1000)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _moment(value: str | None, field: str) -> int | None:
    """Epoch ms of an RFC 3339 filter time, or `invalidRequest` naming the field."""
    if value is None:
        return None
    try:
        return epoch_ms(value)
    except ValueError:
        raise InvalidRequest(
            f"Field '{field}' is not an RFC 3339 time (e.g. 2026-12-07T05:00:00Z).", details={"field": field}
        ) from None


def _matches(stored: StoredApproval, request: ApprovalsHistoryRequest) -> bool:
    n = stored.needed
    return (
        stored.state in ("approved", "denied")
        and (request.toolset_id is None or n.toolset_id == request.toolset_id)
        and (request.namespace is None or n.namespace == request.namespace)
        and (request.tool is None or n.tool == request.tool)
        and (request.decider is None or stored.decider == request.decider)
        and (request.outcome is None or stored.state == request.outcome)
    )


def _record(stored: StoredApproval) -> ApprovalRecord:
    n = stored.needed
    return ApprovalRecord(
        approval_id=n.approval_id,
        call_id=n.call_id,
        run_id=n.run_id,
        namespace=n.namespace,
        toolset_id=n.toolset_id,
        tool=n.tool,
        decision="approved" if stored.state == "approved" else "denied",
        reason=stored.reason,
        decider=stored.decider,
        requested_at=n.requested_at,
        decided_at=stored.decided_at or "",
        input_digest=n.input_digest,
        edited_input_digest=None if stored.edited_input is None else sha256_hex(stored.edited_input),
    )


def _conflict_message(approval_id: str, result: DecideResult) -> str:
    if result.state == "cancelled":
        return f"Approval '{approval_id}' was cancelled because its run closed; nothing can be decided on it."
    if result.reason == EXPIRED_REASON:
        return f"Approval '{approval_id}' already expired and was denied; the first decision stands."
    return f"Approval '{approval_id}' was already {result.state}; the first decision stands."


def _conflict_details(result: DecideResult) -> dict[str, Any]:
    details: dict[str, Any] = {"state": result.state}
    if result.reason:
        details["reason"] = result.reason
    return details
