"""The console's pages and forms for a signed-in person: pending approvals (and the fragment the
page reloads), decide (with an edited input), check an edited input, remembered decisions,
history, and the live stream. Each calls the `Approvals` method the NATS handler calls, and shows
or lets decide only what the person's groups cover."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import orjson
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route
from toolbus_contracts.approvals import ApprovalRequested, ApprovalsHistoryRequest, Remember
from toolbus_contracts.errors import Conflict, InvalidRequest, NotFound

from toolbus_approval.approvals import encode_cursor
from toolbus_approval.console.access import Person
from toolbus_approval.console.live import Update
from toolbus_approval.console.security import csrf_ok
from toolbus_approval.store import StoredApproval

if TYPE_CHECKING:
    from toolbus_approval.console.web import Console

PENDING_MAX = 200
"""Pending approvals one page shows (oldest first)."""
HISTORY_PAGE = 50
HEARTBEAT_SECONDS = 15.0
REMEMBERED_MAX = 1000


def routes(c: Console) -> list[Route]:
    """The pages; each answers 303 to `/login` (a page) or 401 (a form, the stream) without a person."""

    def signed_in(
        handler: Callable[[Request, Person], Awaitable[Response]], *, page: bool = True
    ) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            person = c.person(request)
            if person is None:
                if page and request.method == "GET":
                    return RedirectResponse(f"{c.base}/login", status_code=303)
                return JSONResponse({"ok": False, "message": "Sign in first."}, status_code=401)
            return await handler(request, person)

        return wrapped

    async def pending(request: Request, person: Person) -> Response:
        items, more = await pending_items(c, person)
        return c.page(request, "pending.html", items=items, more=more, error=None)

    async def pending_fragment(request: Request, person: Person) -> Response:
        items, more = await pending_items(c, person)
        return c.page(request, "_pending_list.html", items=items, more=more)

    async def refuse(request: Request, person: Person, status: int, message: str) -> Response:
        items, more = await pending_items(c, person)
        return c.page(request, "pending.html", status, items=items, more=more, error=message)

    async def decide(request: Request, person: Person) -> Response:
        form = await request.form()
        if not csrf_ok(request, form):
            return await refuse(
                request, person, 403, "Refused: missing or wrong CSRF token; reload the page."
            )
        decision = form.get("decision")
        if decision not in ("approve", "deny"):
            return await refuse(
                request,
                person,
                400,
                "Choose Approve or Deny (decision: approve or deny); nothing was decided.",
            )
        approval_id = request.path_params["approval_id"]
        stored, status, message = await decidable(c, person, approval_id)
        if stored is None:
            return await refuse(request, person, status, message)
        if form.get("remember") and not person.may_remembered(stored.needed.namespace):
            return await refuse(
                request,
                person,
                403,
                (
                    "Refused: a remembered decision decides the tool's calls from every toolset in "
                    f"namespace {stored.needed.namespace or '(none)'}, and your groups cover only "
                    "some toolsets there; nothing was decided."
                ),
            )
        approve = decision == "approve"
        reason = str(form.get("reason") or "").strip() or None
        edited = None
        if approve and form.get("input") is not None:
            try:
                parsed = json.loads(str(form.get("input")))
            except ValueError:
                return await refuse(
                    request, person, 400, "The edited input is not JSON; nothing was decided."
                )
            if parsed != stored.needed.input:
                if not isinstance(parsed, dict):
                    return await refuse(request, person, 400, "The edited input must be a JSON object.")
                edited = parsed
        try:
            remember = None
            if form.get("remember"):
                remember = Remember.model_validate(
                    {"for": str(form.get("remember")), "sameInput": form.get("same_input") == "on"}
                )
            await c.approvals.decide(
                approval_id,
                approve=approve,
                reason=reason,
                edited_input=edited,
                decider=person.decider,
                remember=remember,
            )
        except ValidationError:
            return await refuse(request, person, 400, "Remember for: not a duration; nothing was decided.")
        except Conflict as exc:
            return await refuse(request, person, 409, exc.message)
        except (InvalidRequest, NotFound) as exc:
            return await refuse(request, person, 400 if isinstance(exc, InvalidRequest) else 404, exc.message)
        what = (
            "approved with the edited input" if edited is not None else ("approved" if approve else "denied")
        )
        request.session["flash"] = f"{stored.needed.tool} ({approval_id}) {what}."
        return RedirectResponse(f"{c.base}/", status_code=303)

    async def check(request: Request, person: Person) -> Response:
        if not csrf_ok(request):
            return JSONResponse({"ok": False, "message": "Missing or wrong CSRF token."}, status_code=403)
        approval_id = request.path_params["approval_id"]
        stored, _, _ = await decidable(c, person, approval_id)
        if stored is None:
            # Outside one's groups reads as unknown: a check does not say which approvals exist.
            return JSONResponse({"ok": False, "message": _unknown(approval_id)}, status_code=404)
        try:
            body = orjson.loads(await request.body())
            edited = json.loads(body["input"])
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"ok": False, "message": "Not JSON yet."})
        if not isinstance(edited, dict):
            return JSONResponse({"ok": False, "message": "The input must be a JSON object."})
        try:
            await c.approvals.check_edit(stored.needed.approval_id, True, edited)
        except InvalidRequest as exc:
            return JSONResponse({"ok": False, "message": exc.message, "details": exc.details})
        return JSONResponse({"ok": True, "message": "Valid for the tool's input schema."})

    async def remembered(request: Request, person: Person) -> Response:
        found, truncated = await c.approvals.remembered_in_force(
            namespace=None, tool=None, limit=REMEMBERED_MAX
        )
        shown = [r for r in found if person.may_remembered(r.namespace)]
        return c.page(request, "remembered.html", remembered=shown, truncated=truncated, error=None)

    async def revoke(request: Request, person: Person) -> Response:
        form = await request.form()
        remembered_id = request.path_params["remembered_id"]
        error, status = None, 200
        if not csrf_ok(request, form):
            error, status = "Refused: missing or wrong CSRF token; reload the page.", 403
        else:
            found = await c.approvals.remembered(remembered_id)
            if found is None:
                error, status = (
                    f"No remembered decision {remembered_id} in force: it expired or was revoked.",
                    404,
                )
            elif not person.may_remembered(found.namespace):
                error, status = f"Your groups do not cover namespace {found.namespace or '(none)'}.", 403
            else:
                try:
                    await c.approvals.revoke(remembered_id)
                except NotFound as exc:
                    error, status = exc.message, 404
        if error is None:
            request.session["flash"] = f"Remembered decision {remembered_id} revoked."
            return RedirectResponse(f"{c.base}/remembered", status_code=303)
        found_all, truncated = await c.approvals.remembered_in_force(
            namespace=None, tool=None, limit=REMEMBERED_MAX
        )
        shown = [r for r in found_all if person.may_remembered(r.namespace)]
        return c.page(request, "remembered.html", status, remembered=shown, truncated=truncated, error=error)

    async def history(request: Request, person: Person) -> Response:
        q = request.query_params
        filters = {
            k: q.get(k, "").strip()
            for k in ("toolset", "namespace", "tool", "decider", "outcome", "since", "until")
        }
        body: dict[str, Any] = {
            "toolsetId": filters["toolset"] or None,
            "namespace": filters["namespace"] or None,
            "tool": filters["tool"] or None,
            "decider": filters["decider"] or None,
            "outcome": filters["outcome"] or None,
            "since": _utc(filters["since"]),
            "until": _utc(filters["until"]),
            "limit": HISTORY_PAGE,
            "cursor": q.get("cursor") or None,
        }
        rows: list[Any] = []
        error, next_url = None, None
        try:
            page, before = await c.approvals.history(ApprovalsHistoryRequest.model_validate(body))
            rows = [r for r in page if person.may(r.toolset_id, r.namespace)]
            if before is not None:
                kept = {k: v for k, v in filters.items() if v}
                next_url = f"{c.base}/history?" + urlencode({**kept, "cursor": encode_cursor(before)})
        except ValidationError as exc:
            first = exc.errors()[0]
            error = f"Filter {'.'.join(map(str, first['loc']))}: {first['msg']}."
        except InvalidRequest as exc:
            error = exc.message
        return c.page(
            request,
            "history.html",
            400 if error else 200,
            rows=rows,
            filters=filters,
            next_url=next_url,
            error=error,
        )

    async def events(request: Request, person: Person) -> Response:
        queue = c.hub.listen()

        async def stream() -> AsyncIterator[bytes]:
            try:
                yield b"retry: 3000\n\n"
                while True:
                    try:
                        update = await asyncio.wait_for(queue.get(), HEARTBEAT_SECONDS)
                    except TimeoutError:
                        yield b": keepalive\n\n"
                        continue
                    if update is None:
                        return
                    if person.may(update.toolset_id, update.namespace):
                        yield _sse(update)
            finally:
                c.hub.forget(queue)

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"X-Accel-Buffering": "no"}
        )

    return [
        Route("/", signed_in(pending)),
        Route("/pending", signed_in(pending_fragment)),
        Route("/approvals/{approval_id}/decide", signed_in(decide, page=False), methods=["POST"]),
        Route("/approvals/{approval_id}/check", signed_in(check, page=False), methods=["POST"]),
        Route("/remembered", signed_in(remembered)),
        Route("/remembered/{remembered_id}/revoke", signed_in(revoke, page=False), methods=["POST"]),
        Route("/history", signed_in(history)),
        Route("/events", signed_in(events, page=False)),
    ]


async def pending_items(c: Console, person: Person) -> tuple[list[dict[str, Any]], bool]:
    """The oldest pending approvals the person may decide (at most `PENDING_MAX`), and whether
    more are waiting: read per namespace when every grant names its namespaces."""
    namespaces = person.namespaces()
    found_pages: list[tuple[list[ApprovalRequested], bool]] = []
    for namespace in sorted(namespaces) if namespaces is not None else [None]:
        page, after = await c.approvals.pending(
            run_id=None, namespace=namespace, limit=PENDING_MAX, budget=1 << 30
        )
        found_pages.append((page, after is not None))
    found = sorted(
        (a for page, _ in found_pages for a in page), key=lambda a: (a.requested_at, a.approval_id)
    )
    mine = [a for a in found if person.may(a.toolset_id, a.namespace)]
    items = [
        {
            "a": approval,
            "input": json.dumps(approval.input, indent=2, ensure_ascii=False, sort_keys=True),
            "declaration": await c.declarations.line(approval.toolset_id, approval.tool),
        }
        for approval in mine[:PENDING_MAX]
    ]
    return items, len(mine) > PENDING_MAX or any(more for _, more in found_pages)


async def decidable(c: Console, person: Person, approval_id: str) -> tuple[StoredApproval | None, int, str]:
    """The approval when this person may decide on it; else None, the status (404 unknown, 403
    outside their groups) and why. Whether it is still pending is for `decide` to say."""
    stored = await c.approvals.get(approval_id)
    if stored is None:
        return None, 404, _unknown(approval_id)
    n = stored.needed
    if not person.may(n.toolset_id, n.namespace):
        return (
            None,
            403,
            (
                f"Refused: your groups ({', '.join(person.groups) or 'none'}) do not cover toolset "
                f"{n.toolset_id} in namespace {n.namespace or '(none)'}."
            ),
        )
    return stored, 200, ""


def _unknown(approval_id: str) -> str:
    return f"No approval {approval_id}: it never existed or was decided long ago."


def _sse(update: Update) -> bytes:
    fields = {"approvalId": update.approval_id, "tool": update.tool}
    data = orjson.dumps(fields if update.status is None else {**fields, "status": update.status})
    return b"event: " + update.kind.encode() + b"\ndata: " + data + b"\n\n"


def _utc(value: str) -> str | None:
    """A `datetime-local` field (`2026-12-07T08:00`, read as UTC) or an RFC 3339 time."""
    if not value:
        return None
    if len(value) == 16:
        return value + ":00Z"
    return value
