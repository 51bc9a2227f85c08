"""Approvals: the calls that wait for a person, listed, decided, and followed as they arrive."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

import orjson
from toolbus_contracts import (
    ApprovalDecideReply,
    ApprovalDecideRequest,
    ApprovalRequested,
    ApprovalsListReply,
    ApprovalsListRequest,
)
from toolbus_contracts.approvals import (
    ApprovalsHistoryReply,
    ApprovalsHistoryRequest,
    Remember,
    RememberedDecision,
    RememberedListReply,
    RememberedListRequest,
    RememberedRevokeRequest,
)

from toolbus._connection import flush
from toolbus._core import Core, build
from toolbus._errors import Conflict, ToolbusError, closed_as_unavailable
from toolbus._feeds import next_unless_closed

if TYPE_CHECKING:
    from nats.aio.msg import Msg


class Approvals:
    """`‹p›.approvals.*` and the `events.approvals.requested` event."""

    def __init__(self, tb: Core) -> None:
        self._tb = tb

    async def list(
        self, *, run_id: str | None = None, namespace: str | None = None
    ) -> list[ApprovalRequested]:
        """The pending approvals, oldest first, of one run or one end user where given: every
        page of `approvals.list`, one request each (one decided or arriving meanwhile may be left
        out; none is listed twice)."""
        found: list[ApprovalRequested] = []
        cursor: str | None = None
        while True:
            body = build(ApprovalsListRequest, run_id=run_id, namespace=namespace, cursor=cursor)
            page = ApprovalsListReply.model_validate(
                await self._tb.request(self._tb.subjects.approvals_list, body, retry=True)
            )
            found += page.approvals
            if page.next_cursor is None:
                return found
            cursor = page.next_cursor

    async def decide(
        self,
        approval_id: str,
        approve: bool,
        reason: str | None = None,
        *,
        input: dict[str, Any] | None = None,
        decider: str | None = None,
        remember_for: str | None = None,
        same_input: bool = False,
    ) -> str:
        """Decide one approval; returns `"approved"` or `"denied"`. A second decision: `Conflict`.
        `input`: approve and send this input instead (checked against the tool's schema);
        `decider`: who decides, recorded as the client's word where the server vouches for no
        user; `remember_for` (a duration): decide later calls of the namespace and tool (with
        `same_input`, of this input) the same way until then.

        Sent again after `unavailable` (the first decide may have been applied, its reply lost):
        a retry answered `conflict` whose standing decision (`details.state`, `details.reason`)
        is this very one is taken as this decision's reply; any other `conflict` is raised."""
        remember = None if remember_for is None else Remember(for_=remember_for, same_input=same_input)
        body = build(
            ApprovalDecideRequest,
            approval_id=approval_id,
            approve=approve,
            reason=reason,
            input=input,
            decider=decider,
            remember=remember,
        )
        decision = "approved" if approve else "denied"

        def settle(exc: ToolbusError) -> dict[str, Any] | None:
            same = exc.details.get("state") == decision and (exc.details.get("reason") or None) == (
                reason or None
            )
            if isinstance(exc, Conflict) and same:
                return {"approvalId": approval_id, "decision": decision}
            return None

        data = await self._tb.request(self._tb.subjects.approvals_decide, body, retry=True, settle=settle)
        return ApprovalDecideReply.model_validate(data).decision

    async def history(
        self,
        *,
        toolset_id: str | None = None,
        namespace: str | None = None,
        tool: str | None = None,
        decider: str | None = None,
        outcome: str | None = None,
        since: str | None = None,
        until: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> ApprovalsHistoryReply:
        """One page of `approvals.history`: decisions, newest first, matching every filter given;
        pass its `next_cursor` as `cursor` for the next page."""
        body = build(
            ApprovalsHistoryRequest,
            toolset_id=toolset_id,
            namespace=namespace,
            tool=tool,
            decider=decider,
            outcome=outcome,
            since=since,
            until=until,
            limit=limit,
            cursor=cursor,
        )
        data = await self._tb.request(self._tb.subjects.approvals_history, body, retry=True)
        return ApprovalsHistoryReply.model_validate(data)

    async def remembered(
        self, *, namespace: str | None = None, tool: str | None = None
    ) -> builtins.list[RememberedDecision]:
        """The remembered decisions in force, soonest to expire first."""
        body = build(RememberedListRequest, namespace=namespace, tool=tool)
        data = await self._tb.request(self._tb.subjects.approvals_remembered_list, body, retry=True)
        return RememberedListReply.model_validate(data).remembered

    async def revoke(self, remembered_id: str) -> None:
        """Forget a remembered decision (`NotFound` when none is in force under that id)."""
        body = build(RememberedRevokeRequest, remembered_id=remembered_id)
        await self._tb.request(self._tb.subjects.approvals_remembered_revoke, body, retry=False)

    async def approve(self, approval_id: str, reason: str | None = None) -> str:
        return await self.decide(approval_id, True, reason)

    async def deny(self, approval_id: str, reason: str | None = None) -> str:
        """Deny: the call's outcome is `denied` with `reason`."""
        return await self.decide(approval_id, False, reason)

    async def requests(
        self, *, run_id: str | None = None, namespace: str | None = None
    ) -> AsyncGenerator[ApprovalRequested, None]:
        """Every approval pending now, then each new request as it is published (of one run or end
        user where given), each once. Subscribed before listing, so none falls in between. Runs
        until the caller stops iterating (or closes it: `await gen.aclose()`)."""
        queue: asyncio.Queue[ApprovalRequested] = asyncio.Queue()

        async def on_msg(msg: Msg) -> None:
            with contextlib.suppress(ValueError):
                event = ApprovalRequested.model_validate(orjson.loads(msg.data))
                if (run_id is None or event.run_id == run_id) and (
                    namespace is None or event.namespace == namespace
                ):
                    queue.put_nowait(event)

        subject = self._tb.subjects.approvals_requested
        with closed_as_unavailable(subject):
            sub = await self._tb.nc.subscribe(subject, cb=on_msg)
            await flush(self._tb.nc)
        seen: set[str] = set()
        try:
            for pending in await self.list(run_id=run_id, namespace=namespace):
                seen.add(pending.approval_id)
                yield pending
            while True:
                event = await next_unless_closed(queue, self._tb.nc, subject)
                if event.approval_id not in seen:
                    seen.add(event.approval_id)
                    yield event
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
