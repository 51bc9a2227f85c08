"""The approvals console in a real browser: Debian's chromium driven by Playwright (never a
downloaded browser), a person signing in through a real OpenID Connect provider (oidc-provider),
the registry, the dispatcher and the approval service as processes, a real MCP server.

Proves: a pending approval appears on the open page without a reload (server-sent events), with
its tool, declaration line and input; an edited input is checked as it is typed (an invalid one
says where and disables Approve); approving the edit sends the edited input, and the page says
the call completed (it did, with the edited input); another is denied with a reason, from the keyboard alone (Enter in the reason decides nothing); both are in the
history under the person's name; every form control has a name a screen reader announces. Run on an open NATS and on deploy/nats/'s users and permissions
(nothing refused). Screenshots (pending, edit-invalid, edit, history) are kept in
`.cache/test-artifacts/console/`.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from toolbus_contracts import Subjects
from toolbus_nats_connect import NatsAuth

from tests.approval.conftest import ConsoleSetup
from tests.support.events import stored_events
from tests.support.gates import missing
from tests.support.infra import (
    aservice_process,
    drop_deployment_state,
    drop_redis_keys,
    js_name,
    request_ok,
)
from tests.support.mcp_servers import McpTestServer
from tests.system.security.conftest import start_secured_nats

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / ".cache" / "test-artifacts" / "console"
TIMEOUT_MS = 20_000


class Harness:
    def __init__(self, nc: Any, prefix: str) -> None:
        self.nc = nc
        self.prefix = prefix
        self.subjects = Subjects(prefix)

    async def ok(self, subject: str, body: dict[str, Any], within: float = 15.0) -> dict[str, Any]:
        return await request_ok(self.nc, subject, body, within)

    async def completed(self, run_id: str, call_id: str) -> dict[str, Any]:
        for _ in range(600):
            events = await stored_events(
                self.nc, js_name(self.prefix, "EVENTS"), self.subjects.call_events(run_id, call_id)
            )
            if events and events[-1]["type"] == "completed":
                return {"events": events, "outcome": events[-1]["outcome"]}
            await asyncio.sleep(0.05)
        raise AssertionError(f"call {call_id} did not complete")


@pytest_asyncio.fixture(loop_scope="session", scope="module", params=["open", "secured"])
async def stack(
    request: pytest.FixtureRequest,
    console_setup: ConsoleSetup,
    service_env: dict[str, str],
    nats_url: str,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[Harness, str]]:
    """`open`: the session's NATS; `secured`: deploy/nats/'s users and permissions on a server of
    the test's own (each service as its user, the test as `harness`), so the console's event
    subscriptions and registry requests are shown to be allowed to the approval user."""
    import nats

    if not os.access(CHROMIUM, os.X_OK):
        missing(f"no {CHROMIUM}: install Debian's chromium (make browser, as root)")
    secured = None
    if request.param == "secured":
        secured = start_secured_nats(tmp_path_factory.mktemp("console-nats"), prefixes=[console_setup.prefix])

    def role(name: str) -> dict[str, str]:
        return {"TOOLBUS_NATS_URL": nats_url} if secured is None else secured.env(name)

    env = console_setup.env(service_env)
    nc = await nats.connect(**NatsAuth.from_env(role("harness")).connect_options())
    harness = Harness(nc, console_setup.prefix)
    try:
        async with (
            McpTestServer(name="shop") as mcp,
            aservice_process("registry", env | role("registry")),
            aservice_process("approval", env | role("approval")),
            aservice_process("dispatcher", env | role("dispatcher")),
        ):
            spec = {"mcp": [{"name": "shop", "url": mcp.url, "policies": {"echo": {"approval": True}}}]}
            toolset = (await harness.ok(harness.subjects.toolsets_create, spec, within=30))["id"]
            run = await harness.ok(harness.subjects.runs_open, {"toolsetId": toolset, "namespace": "shop"})
            yield harness, run["runId"]
    finally:
        if secured is None:
            await drop_deployment_state(nc, redis_url, console_setup.prefix)
        else:
            await drop_redis_keys(redis_url, console_setup.prefix)
        await nc.drain()
        if secured is not None:
            secured.server.stop()
            log = secured.server.log_path.read_text(errors="replace")
            refused = [line for line in log.splitlines() if "Violation" in line]
            assert refused == [], refused


@pytest_asyncio.fixture(loop_scope="session")
async def browser_page(console_setup: ConsoleSetup) -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    profile = tempfile.mkdtemp(prefix="toolbus-console-chromium-")
    async with async_playwright() as pw:
        context = await pw.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            args=ARGS,
            headless=True,
            viewport={"width": 1200, "height": 900},
        )
        context.set_default_timeout(TIMEOUT_MS)
        errors: list[str] = []
        page = context.pages[0] if context.pages else await context.new_page()
        # The console's own errors (the provider's pages are not under test).
        ours = console_setup.url

        def on_console(message: Any) -> None:
            if message.type == "error" and str(message.location.get("url", "")).startswith(ours):
                errors.append(f"{message.location.get('url')}: {message.text}")

        page.on("console", on_console)
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            yield page
        finally:
            await context.close()
            shutil.rmtree(profile, ignore_errors=True)
    # A violated content security policy, or a script error, shows up in the console.
    assert errors == [], errors


UNLABELLED = """() => [...document.querySelectorAll('input:not([type=hidden]), select, textarea, button')]
  .filter((e) => !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.textContent.trim())
  .map((e) => e.outerHTML)"""
"""Form controls a screen reader would announce without a name."""


async def start_call(harness: Harness, run_id: str, text: str, key: str) -> str:
    body = {"runId": run_id, "tool": "shop.echo", "input": {"text": text}, "idempotencyKey": key}
    call_id: str = (await harness.ok(harness.subjects.calls_start, body))["callId"]
    return call_id


async def harness_state(harness: Harness, run_id: str, call_id: str) -> str:
    """`pending` while the call's events record no decision, else `decided`."""
    events = await stored_events(
        harness.nc, js_name(harness.prefix, "EVENTS"), harness.subjects.call_events(run_id, call_id)
    )
    return "decided" if any(e["type"] in ("approved", "denied") for e in events) else "pending"


async def test_sign_in_see_live_edit_approve_deny_and_find_both_in_history(
    stack: tuple[Harness, str], console_setup: ConsoleSetup, browser_page: Any
) -> None:
    from playwright.async_api import expect

    harness, run_id = stack
    page = browser_page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    # Sign in through the provider's own login and consent pages.
    await page.goto(console_setup.url + "/")
    await page.get_by_role("link", name="Sign in with your organisation's account").click()
    await page.locator("input[name=login]").fill("alice")
    await page.locator("input[name=password]").fill("any")
    await page.locator("button[type=submit]").click()
    await page.locator("button[type=submit]").click()  # consent
    await expect(page.get_by_role("heading", name="Pending approvals")).to_be_visible()
    await expect(page.get_by_text("console:alice")).to_be_visible()
    await expect(page.locator("#pending")).to_have_attribute("data-live", "on")

    # An approval arrives while the page is open: shown without a reload, announced.
    call_id = await start_call(harness, run_id, "refund 5", "browser-approve")
    item = page.locator("li[data-approval]").first
    await expect(item).to_be_visible()
    await expect(page.locator("#live")).to_contain_text("New approval waiting: shop.echo")
    await expect(item.locator(".declaration")).to_contain_text("shop.echo(")
    await expect(item.locator("textarea")).to_have_value(json.dumps({"text": "refund 5"}, indent=2))
    await page.screenshot(path=str(ARTIFACTS / "pending.png"), full_page=True)
    assert await page.evaluate(UNLABELLED) == []

    # Edit: an invalid input is refused as it is typed, a valid one accepted.
    editor = item.get_by_label("Input (edit it to approve a different one)")
    await editor.fill('{"text": 5}')
    await expect(item.locator(".check")).to_contain_text("invalid at '$.text'")
    await expect(item.get_by_role("button", name="Approve")).to_be_disabled()
    await page.screenshot(path=str(ARTIFACTS / "edit-invalid.png"), full_page=True)
    await editor.fill('{"text": "refund 4"}')
    await expect(item.locator(".check")).to_contain_text("Valid for the tool's input schema")
    await expect(item.get_by_role("button", name="Approve")).to_be_enabled()
    await item.get_by_label("Reason (optional)").fill("refund capped at 4")
    await page.screenshot(path=str(ARTIFACTS / "edit.png"), full_page=True)
    await item.get_by_role("button", name="Approve").click()
    await expect(page.locator(".flash")).to_contain_text("approved with the edited input")
    await expect(page.locator("#live")).to_have_text("Call of shop.echo completed: ok.")

    # The call completes with the edited input.
    done = await harness.completed(run_id, call_id)
    assert done["outcome"] == {"status": "ok", "output": {"text": "refund 4"}}
    approved = next(e for e in done["events"] if e["type"] == "approved")
    assert approved["decider"] == "console:alice" and approved["editedInputDigest"]

    # Another, denied with a reason from the keyboard alone.
    await expect(page.locator("#pending")).to_have_attribute("data-live", "on")
    other = await start_call(harness, run_id, "refund 500", "browser-deny")
    item = page.locator("li[data-approval]").first
    await expect(item.locator("textarea")).to_have_value(json.dumps({"text": "refund 500"}, indent=2))
    await item.get_by_label("Reason (optional)").focus()
    await page.keyboard.type("too much")
    # Enter in the reason decides nothing (the form's default button is a disabled one).
    await page.keyboard.press("Enter")
    await page.wait_for_timeout(1000)
    assert await harness_state(harness, run_id, other) == "pending"
    await expect(page.locator(".flash")).to_contain_text("approved with the edited input")  # no new page
    await expect(item.get_by_label("Reason (optional)")).to_have_value("too much")
    await expect(item.get_by_label("Reason (optional)")).to_be_focused()
    await page.keyboard.press("Tab")  # Approve
    await page.keyboard.press("Tab")  # Deny
    await expect(item.get_by_role("button", name="Deny")).to_be_focused()
    await page.keyboard.press("Enter")
    await expect(page.locator(".flash")).to_contain_text("denied")
    await expect(page.locator("#live")).to_have_text("Call of shop.echo completed: error: denied.")
    await expect(page.locator("li[data-approval]")).to_have_count(0)
    denied = await harness.completed(run_id, other)
    assert denied["outcome"]["status"] == "error" and denied["outcome"]["error"]["code"] == "denied"

    # Both in the history, under alice's name.
    await page.get_by_role("link", name="History").click()
    await page.get_by_label("Decider").fill("console:alice")
    await page.get_by_role("button", name="Filter").click()
    rows = page.locator("tr.decision")
    await expect(rows).to_have_count(2)
    await expect(rows.nth(0)).to_contain_text("denied")
    await expect(rows.nth(0)).to_contain_text("too much")
    await expect(rows.nth(1)).to_contain_text("approved")
    await expect(rows.nth(1)).to_contain_text("refund capped at 4")
    await page.screenshot(path=str(ARTIFACTS / "history.png"), full_page=True)
    assert await page.evaluate(UNLABELLED) == []
    await page.get_by_role("link", name="Remembered").click()
    await expect(page.get_by_role("heading", name="Remembered decisions")).to_be_visible()
    assert await page.evaluate(UNLABELLED) == []
