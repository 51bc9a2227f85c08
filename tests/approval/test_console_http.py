"""The approvals console over HTTP, as an attacker would try it: the approval service as a process
with its console, people signed in through a real OpenID Connect provider, approvals sent to it as
the dispatcher sends them (signed commands on the INTERNAL stream).

Proves: a request without a signed session is sent to sign in or refused, and so is a forged
cookie; a POST without the session's CSRF token, or with another's, decides nothing, nor one whose
decision is missing or neither approve nor deny (400); a person sees
and decides only the approvals their groups cover (a decision outside them is refused, saying so);
a decision on an approval already decided, expired or whose run closed is refused, saying which;
a decision names its decider `console:<sub>` in the history; a sign-in's state is used once; no
page, header or cookie holds a secret; every answer has the security headers.
"""

from __future__ import annotations

import asyncio
import base64
import html
import json
import re
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from toolbus_common.canonical import sha256_hex
from toolbus_contracts import Subjects
from toolbus_contracts.internal import ApprovalNeeded, RunClosed

from tests.approval.conftest import ConsoleSetup, csrf_of, decide_form, sign_in
from tests.support.commands import publish_command
from tests.support.infra import aservice_process, drop_deployment_state, request

pytestmark = pytest.mark.e2e


class Deployment:
    def __init__(self, nc: Any, setup: ConsoleSetup, log_path: Path) -> None:
        self.nc = nc
        self.log_path = log_path
        self.js = nc.jetstream()
        self.setup = setup
        self.subjects = Subjects(setup.prefix)

    async def needs_approval(
        self, namespace: str, *, tool: str = "shop.refund", timeout: str | None = None, pending: bool = True
    ) -> ApprovalNeeded:
        """An approval as the dispatcher asks for it, once stored (`pending`, or else decided)."""
        suffix = secrets.token_hex(6)
        body = {"amount": 5}
        needed = ApprovalNeeded(
            approval_id=f"apr_{suffix}",
            call_id=f"call_{suffix}",
            run_id=f"run_{suffix}",
            namespace=namespace,
            toolset_id="ts_" + "0" * 16,
            tool=tool,
            input=body,
            input_digest=sha256_hex(body),
            requested_at=_now(),
            timeout=timeout,
        )
        subject = self.subjects.internal_approval_requests
        await publish_command(self.js, subject, needed.wire_json(), msg_id=f"needed-{suffix}")
        for _ in range(200):
            state = await self.state(needed.approval_id)
            if (state == "pending") if pending else (state not in (None, "pending")):
                return needed
            await asyncio.sleep(0.025)
        raise AssertionError("the approval service did not store the approval")

    async def state(self, approval_id: str) -> str | None:
        """`pending`, or the decision `approvals.history` records, or None."""
        listed = await request(self.nc, self.subjects.approvals_list, {}, timeout=5)
        if any(a["approvalId"] == approval_id for a in listed["data"]["approvals"]):
            return "pending"
        history = await request(self.nc, self.subjects.approvals_history, {}, timeout=5)
        for record in history["data"]["decisions"]:
            if record["approvalId"] == approval_id:
                return f"{record['decision']} by {record['decider']}"
        return None


def _now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def deployment(
    console_setup: ConsoleSetup, service_env: dict[str, str], nats_url: str, redis_url: str
) -> AsyncIterator[Deployment]:
    import nats

    nc = await nats.connect(nats_url)
    try:
        async with aservice_process("approval", console_setup.env(service_env)) as service:
            yield Deployment(nc, console_setup, service.log_path)
    finally:
        await drop_deployment_state(nc, redis_url, console_setup.prefix)
        await nc.drain()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def alice(deployment: Deployment) -> AsyncIterator[httpx.AsyncClient]:
    client = await sign_in(deployment.setup, "alice")
    yield client
    await client.aclose()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def bob(deployment: Deployment) -> AsyncIterator[httpx.AsyncClient]:
    client = await sign_in(deployment.setup, "bob")
    yield client
    await client.aclose()


async def csrf(client: httpx.AsyncClient) -> str:
    return csrf_of((await client.get("/")).text)


async def test_without_a_signed_session_nothing_is_shown_or_decided(deployment: Deployment) -> None:
    needed = await deployment.needs_approval("shop")
    async with httpx.AsyncClient(base_url=deployment.setup.url, follow_redirects=False) as anon:
        for path in ("/", "/history", "/remembered", "/pending"):
            answer = await anon.get(path)
            assert answer.status_code == 303 and answer.headers["location"] == "/login", path
        page = await anon.get("/login")
        form = decide_form(csrf_of(page.text), "approve")  # a session's token, but no person in it
        refused = await anon.post(f"/approvals/{needed.approval_id}/decide", data=form)
        assert refused.status_code == 401
        assert (await anon.get("/events")).status_code == 401
        # A cookie the console did not sign is no session.
        anon.cookies.set("toolbus_console", base64.b64encode(b'{"sub": "alice"}').decode() + ".forged.sig")
        assert (await anon.post(f"/approvals/{needed.approval_id}/decide", data=form)).status_code == 401
        assert (await anon.get("/")).status_code == 303
    assert await deployment.state(needed.approval_id) == "pending"


async def test_a_missing_or_forged_csrf_token_decides_nothing(
    deployment: Deployment, alice: httpx.AsyncClient, bob: httpx.AsyncClient
) -> None:
    needed = await deployment.needs_approval("shop")
    url = f"/approvals/{needed.approval_id}/decide"
    missing = await alice.post(url, data={"decision": "approve"})
    assert missing.status_code == 403 and "CSRF" in missing.text
    forged = await alice.post(url, data=decide_form(secrets.token_urlsafe(32), "approve"))
    assert forged.status_code == 403
    # bob's token is a real one, of another session.
    others = await alice.post(url, data=decide_form(await csrf(bob), "approve"))
    assert others.status_code == 403
    check = await alice.post(
        f"/approvals/{needed.approval_id}/check", json={"input": "{}"}, headers={"X-CSRF-Token": "x"}
    )
    assert check.status_code == 403
    huge = await alice.post(url, data=decide_form(await csrf(alice), "approve", input="x" * (2 << 20)))
    assert huge.status_code == 413
    logout = await alice.post("/logout", data={"csrf": "nope"})
    assert logout.status_code == 403
    assert await deployment.state(needed.approval_id) == "pending"


async def test_a_chunked_body_over_the_bound_is_refused_413_without_a_traceback(
    deployment: Deployment, alice: httpx.AsyncClient
) -> None:
    needed = await deployment.needs_approval("shop")
    token = await csrf(alice)

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: sent chunked
        yield f"csrf={token}&decision=approve&input=".encode()
        for _ in range(40):
            yield b"x" * 65536

    huge = await alice.post(
        f"/approvals/{needed.approval_id}/decide",
        content=chunks(),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert huge.status_code == 413 and "too large" in huge.text
    assert "content-length" not in huge.request.headers
    assert await deployment.state(needed.approval_id) == "pending"
    log = deployment.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "over the console's bound" not in log


async def test_a_decision_other_than_approve_or_deny_is_refused_and_decides_nothing(
    deployment: Deployment, alice: httpx.AsyncClient
) -> None:
    needed = await deployment.needs_approval("shop")
    url = f"/approvals/{needed.approval_id}/decide"
    token = await csrf(alice)
    for form in (
        {"csrf": token, "reason": "pressed Enter"},
        decide_form(token, ""),
        decide_form(token, "yes"),
    ):
        refused = await alice.post(url, data=form)
        assert refused.status_code == 400, form
        assert (
            "Choose Approve or Deny" in html.unescape(refused.text) and "nothing was decided" in refused.text
        )
    assert await deployment.state(needed.approval_id) == "pending"


async def test_a_person_sees_and_decides_only_what_their_groups_cover(
    deployment: Deployment, alice: httpx.AsyncClient, bob: httpx.AsyncClient
) -> None:
    shop = await deployment.needs_approval("shop")
    elsewhere = await deployment.needs_approval("elsewhere")
    alices, bobs = (await alice.get("/")).text, (await bob.get("/")).text
    assert shop.approval_id in alices and elsewhere.approval_id not in alices
    assert elsewhere.approval_id in bobs and shop.approval_id not in bobs
    refused = await bob.post(
        f"/approvals/{shop.approval_id}/decide", data=decide_form(await csrf(bob), "approve")
    )
    assert refused.status_code == 403
    assert "do not cover" in refused.text and "namespace shop" in refused.text
    assert await deployment.state(shop.approval_id) == "pending"
    check = await bob.post(
        f"/approvals/{shop.approval_id}/check",
        json={"input": "{}"},
        headers={"X-CSRF-Token": await csrf(bob)},
    )
    # Outside bob's groups the check answers as for an unknown id, naming no toolset or namespace.
    unknown = await bob.post(
        "/approvals/apr_nope/check", json={"input": "{}"}, headers={"X-CSRF-Token": await csrf(bob)}
    )
    assert check.status_code == unknown.status_code == 404
    assert check.json()["message"] == unknown.json()["message"].replace("apr_nope", shop.approval_id)
    assert shop.toolset_id not in check.text and "shop" not in check.text.replace(shop.approval_id, "")
    # Within her groups alice decides, and the decision names her.
    done = await alice.post(
        f"/approvals/{shop.approval_id}/decide",
        data=decide_form(await csrf(alice), "deny", reason="not today"),
    )
    assert done.status_code == 303, done.text
    assert await deployment.state(shop.approval_id) == "denied by console:alice"
    history = (await alice.get("/history", params={"decider": "console:alice"})).text
    assert shop.approval_id in history and "not today" in history
    assert shop.approval_id not in (await bob.get("/history")).text


async def test_an_approval_decided_expired_or_closed_is_refused_saying_which(
    deployment: Deployment, alice: httpx.AsyncClient
) -> None:
    token = await csrf(alice)
    decided = await deployment.needs_approval("shop")
    first = await alice.post(f"/approvals/{decided.approval_id}/decide", data=decide_form(token, "approve"))
    assert first.status_code == 303
    again = await alice.post(f"/approvals/{decided.approval_id}/decide", data=decide_form(token, "deny"))
    assert again.status_code == 409 and "already approved" in again.text
    expiring = await deployment.needs_approval("shop", timeout="1s")
    for _ in range(200):
        if (await deployment.state(expiring.approval_id) or "").startswith("denied"):
            break
        await asyncio.sleep(0.05)
    late = await alice.post(f"/approvals/{expiring.approval_id}/decide", data=decide_form(token, "approve"))
    assert late.status_code == 409 and "already expired" in late.text
    closing = await deployment.needs_approval("shop")
    closed = RunClosed(run_id=closing.run_id, toolset_id=closing.toolset_id, call_ids=[closing.call_id])
    subject = deployment.subjects.internal_runs_closed
    await publish_command(deployment.js, subject, closed.wire_json(), msg_id=f"closed-{closing.run_id}")
    for _ in range(200):
        if await deployment.state(closing.approval_id) is None:
            break
        await asyncio.sleep(0.025)
    cancelled = await alice.post(
        f"/approvals/{closing.approval_id}/decide", data=decide_form(token, "approve")
    )
    assert cancelled.status_code == 409 and "run closed" in cancelled.text
    unknown = await alice.post("/approvals/apr_nope/decide", data=decide_form(token, "approve"))
    assert unknown.status_code == 404


async def test_an_edited_input_that_is_not_an_object_decides_nothing(
    deployment: Deployment, alice: httpx.AsyncClient
) -> None:
    needed = await deployment.needs_approval("shop")
    token = await csrf(alice)
    check = await alice.post(
        f"/approvals/{needed.approval_id}/check",
        json={"input": '{"amount": '},
        headers={"X-CSRF-Token": token},
    )
    assert check.status_code == 200 and check.json()["ok"] is False
    not_json = await alice.post(
        f"/approvals/{needed.approval_id}/decide", data=decide_form(token, "approve", input="{nope")
    )
    assert not_json.status_code == 400 and "not JSON" in not_json.text
    # Unchanged input: a plain approval, not an edit.
    same = json.dumps(needed.input, indent=2)
    done = await alice.post(
        f"/approvals/{needed.approval_id}/decide", data=decide_form(token, "approve", input=same)
    )
    assert done.status_code == 303
    history = await request(deployment.nc, deployment.subjects.approvals_history, {}, timeout=5)
    record = next(r for r in history["data"]["decisions"] if r["approvalId"] == needed.approval_id)
    assert record.get("editedInputDigest") is None


async def test_a_sign_in_state_is_used_once_and_must_be_this_browsers(deployment: Deployment) -> None:
    from tests.support.oauth import consent

    setup = deployment.setup
    async with httpx.AsyncClient(base_url=setup.url, follow_redirects=False, timeout=15) as browser:
        started = await browser.get("/login/oidc")
        back = await consent(started.headers["location"], login="alice", callback="/auth/callback")
        async with httpx.AsyncClient(follow_redirects=False) as other:  # another browser, same link
            stolen = await other.get(back)
            assert stolen.status_code == 400 and "not started in this browser" in stolen.text
        first = await browser.get(back)
        assert first.status_code == 303
        replay = await browser.get(back)
        assert replay.status_code == 400


async def test_no_secret_in_any_page_header_or_cookie(
    deployment: Deployment, alice: httpx.AsyncClient
) -> None:
    setup = deployment.setup
    await deployment.needs_approval("shop")
    secrets_ = [setup.client_secret, setup.dev_token, "eyJ"]  # "eyJ": the start of any JWT
    for path in ("/", "/pending", "/history", "/remembered", "/login", "/static/console.js"):
        answer = await alice.get(path)
        assert answer.status_code == 200, path
        headers = answer.headers
        assert headers["content-security-policy"].startswith("default-src 'self'")
        assert "unsafe-inline" not in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY" and headers["cache-control"] == "no-store"
        for secret in secrets_:
            assert secret not in answer.text, (path, secret)
            # (the session cookie is base64 JSON, "eyJ..." too: its payload is read below)
            others = [v for k, v in headers.items() if k != "set-cookie"]
            assert secret not in str(others), (path, secret)
        if path != "/static/console.js":
            assert "<script>" not in answer.text and " style=" not in answer.text
    cookie = next(c for c in alice.cookies.jar if c.name == "toolbus_console")
    assert cookie.has_nonstandard_attr("httponly")
    payload = base64.b64decode(str(cookie.value).split(".")[0] + "==").decode()
    session = json.loads(payload)
    assert set(session) <= {"sub", "name", "groups", "dev", "csrf", "flash"}, session
    for secret in secrets_:
        assert secret not in payload
    login = await alice.get("/login/oidc")
    set_cookie = login.headers["set-cookie"].lower()
    assert "httponly" in set_cookie and "samesite=lax" in set_cookie


async def test_remembered_decisions_are_listed_and_revoked_within_ones_groups(
    deployment: Deployment, alice: httpx.AsyncClient, bob: httpx.AsyncClient
) -> None:
    needed = await deployment.needs_approval("shop", tool="shop.remembered")
    body = {"approvalId": needed.approval_id, "approve": True, "remember": {"for": "1h"}}
    decided = await request(deployment.nc, deployment.subjects.approvals_decide, body, timeout=5)
    remembered_id = decided["data"]["rememberedId"]
    url = f"/remembered/{remembered_id}/revoke"
    assert url in (await alice.get("/remembered")).text
    assert remembered_id not in (await bob.get("/remembered")).text
    refused = await bob.post(url, data={"csrf": await csrf(bob)})
    assert refused.status_code == 403 and "namespace shop" in refused.text
    assert (await alice.post(url, data={"csrf": "forged"})).status_code == 403
    listed = await request(deployment.nc, deployment.subjects.approvals_remembered_list, {}, timeout=5)
    assert remembered_id in [r["rememberedId"] for r in listed["data"]["remembered"]]
    revoked = await alice.post(url, data={"csrf": await csrf(alice)})
    assert revoked.status_code == 303
    assert url not in (await alice.get("/remembered")).text  # no revoke form for it any more
    listed = await request(deployment.nc, deployment.subjects.approvals_remembered_list, {}, timeout=5)
    assert remembered_id not in [r["rememberedId"] for r in listed["data"]["remembered"]]
    again = await alice.post(url, data={"csrf": await csrf(alice)})
    assert again.status_code == 404


async def test_the_live_stream_tells_a_person_only_of_approvals_their_groups_cover(
    deployment: Deployment, bob: httpx.AsyncClient
) -> None:
    seen: list[str] = []

    async def listen() -> None:
        async with bob.stream("GET", "/events", timeout=30) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            async for line in stream.aiter_lines():
                seen.append(line)
                if line.startswith("data:") and "elsewhere.tool" in line:
                    return

    listening = asyncio.create_task(listen())
    await asyncio.sleep(0.5)  # the stream is open and subscribed
    hidden = await deployment.needs_approval("shop", tool="shop.hidden")
    shown = await deployment.needs_approval("elsewhere", tool="elsewhere.tool")
    await asyncio.wait_for(listening, 20)
    text = "\n".join(seen)
    assert "event: requested" in text and shown.approval_id in text
    assert hidden.approval_id not in text and "shop.hidden" not in text


async def test_history_filters_by_outcome_and_refuses_a_bad_time(
    deployment: Deployment, alice: httpx.AsyncClient
) -> None:
    token = await csrf(alice)
    approved, denied = await deployment.needs_approval("shop"), await deployment.needs_approval("shop")
    await alice.post(f"/approvals/{approved.approval_id}/decide", data=decide_form(token, "approve"))
    await alice.post(f"/approvals/{denied.approval_id}/decide", data=decide_form(token, "deny"))
    only_denied = (await alice.get("/history", params={"outcome": "denied"})).text
    assert denied.approval_id in only_denied and approved.approval_id not in only_denied
    bad = await alice.get("/history", params={"since": "yesterday"})
    assert bad.status_code == 400 and "since" in bad.text


async def test_a_decision_can_be_remembered_from_the_console(
    deployment: Deployment, alice: httpx.AsyncClient
) -> None:
    token = await csrf(alice)
    first = await deployment.needs_approval("shop", tool="shop.again")
    bad = await alice.post(
        f"/approvals/{first.approval_id}/decide", data=decide_form(token, "approve", remember="soon")
    )
    assert bad.status_code == 400 and await deployment.state(first.approval_id) == "pending"
    done = await alice.post(
        f"/approvals/{first.approval_id}/decide", data=decide_form(token, "approve", remember="1h")
    )
    assert done.status_code == 303
    remembered = (await alice.get("/remembered")).text
    assert "shop.again" in remembered and "console:alice" in remembered
    # The next call of the tool in the namespace is decided at once, by the remembered decision.
    second = await deployment.needs_approval("shop", tool="shop.again", pending=False)
    assert (await deployment.state(second.approval_id) or "").startswith("approved by remembered:")


async def test_only_a_person_covering_every_toolset_may_remember_a_decision(
    deployment: Deployment, alice: httpx.AsyncClient
) -> None:
    # A remembered decision names a namespace and tool, no toolset: it would decide the tool's
    # calls from every toolset in the namespace, more than carol's one-toolset grant covers.
    carol = await sign_in(deployment.setup, "carol")
    try:
        needed = await deployment.needs_approval("shop", tool="shop.limited")
        page = (await carol.get("/")).text
        assert needed.approval_id in page and 'name="remember"' not in page
        token = await csrf(carol)
        refused = await carol.post(
            f"/approvals/{needed.approval_id}/decide", data=decide_form(token, "approve", remember="1h")
        )
        assert refused.status_code == 403 and "every toolset" in refused.text
        assert await deployment.state(needed.approval_id) == "pending"
        listed = await request(deployment.nc, deployment.subjects.approvals_remembered_list, {}, timeout=5)
        assert "shop.limited" not in [r["tool"] for r in listed["data"]["remembered"]]
        # Without remembering, carol decides it; alice, covering every toolset in shop, may remember.
        assert 'name="remember"' in (await alice.get("/")).text
        done = await carol.post(f"/approvals/{needed.approval_id}/decide", data=decide_form(token, "approve"))
        assert done.status_code == 303
        assert await deployment.state(needed.approval_id) == "approved by console:carol"
        other = await deployment.needs_approval("shop", tool="shop.limited")
        kept = await alice.post(
            f"/approvals/{other.approval_id}/decide",
            data=decide_form(await csrf(alice), "approve", remember="1h"),
        )
        assert kept.status_code == 303
        assert "shop.limited" in (await alice.get("/remembered")).text
    finally:
        await carol.aclose()


async def test_history_is_paged_with_the_filters_kept(
    deployment: Deployment, alice: httpx.AsyncClient
) -> None:
    ids = []
    for _ in range(55):
        needed = await deployment.needs_approval("shop", tool="shop.paged")
        body = {"approvalId": needed.approval_id, "approve": False}
        assert (await request(deployment.nc, deployment.subjects.approvals_decide, body, timeout=5))["ok"]
        ids.append(needed.approval_id)
    first = (await alice.get("/history", params={"tool": "shop.paged"})).text
    assert first.count('class="decision"') == 50
    found = re.search(r'<a href="([^"]+)" rel="next">', first)
    assert found, "no link to older decisions"
    older = html.unescape(found.group(1))
    assert "tool=shop.paged" in older and "cursor=" in older
    second = (await alice.get(older)).text
    assert second.count('class="decision"') == 5 and 'rel="next"' not in second
    shown = {i for i in ids if i in first or i in second}
    assert shown == set(ids)
