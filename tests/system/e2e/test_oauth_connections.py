"""Connected accounts end to end: a real OAuth 2.1 authorization server (oidc-provider from npm:
PKCE, refresh-token rotation, resource indicators, dynamic registration, 4-second JWT access
tokens), an MCP server that accepts only its tokens (checked against its JWKS, audience = the
server), the registry, two credentials replicas and the dispatcher as processes, the end user's
login and consent driven over HTTP on the provider's own pages.

Proves, in order (one module, one stack): a toolset whose server takes only OAuth tokens is
registered with a token of the client-credentials grant and kept connected at the toolset level;
connecting an end user (namespace) and a run, then calls that use their tokens; 100 calls across
several token lifetimes with no call parked, each token renewed by one replica (rotation would
refuse a second refresh with the same token); step-up on `insufficient_scope` asking for the
scope the server's challenge names (a client-credentials token only within the operator's
`maxScopes`); a revoked grant
parks the call, `credentials.expired` carries an authorization URL, connecting there resumes the
call with the same idempotency key; refused consent, no or an unknown (replayed) state, a forged
`iss`, a code for another client and a provider that is down: a clear page, a
`credentials.failed` event, nothing stored; status and disconnect (revoked, RFC 7009); and no
token, code, state or client secret in any reply, event, log line, JetStream message or Redis
value.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from toolbus_contracts import Subjects
from toolbus_devstack.processes import free_port

from tests.support.bus_modes import Bus
from tests.support.events import stored_events
from tests.support.infra import js_name, request, until
from tests.support.mcp_servers import McpTestServer
from tests.support.oauth import OidcProvider, consent, provider_available, query, resource_guard

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not provider_available(), reason="oidc-provider not installed (make npm-tools)"),
]

M2M_ID = "toolbus-m2m"
M2M_SECRET = "m2m-" + secrets.token_hex(16)
OTHER_CLIENT = "other-public-client"
TTL = 4


class Stack:
    """What the test sees: replies and events (kept for the secrets scan), the parts it drives."""

    def __init__(
        self, nc: Any, prefix: str, provider: OidcProvider, server: McpTestServer, callback: str
    ) -> None:
        self.nc = nc
        self.subjects = Subjects(prefix)
        self.prefix = prefix
        self.provider = provider
        self.server = server
        self.callback = callback
        self.start = callback.rsplit("/", 1)[0] + "/start/"
        self.replies: list[dict[str, Any]] = []
        self.events: dict[str, list[dict[str, Any]]] = {"expired": [], "connected": [], "failed": []}
        self.pages: list[str] = []
        self.secrets: set[str] = {M2M_SECRET}
        self.logs: list[Path] = []
        self.toolset_id = ""

    async def ask(self, subject: str, body: dict[str, Any], within: float = 20.0) -> dict[str, Any]:
        reply = await request(self.nc, subject, body, timeout=within)
        self.replies.append(reply)
        return reply

    async def ok(self, subject: str, body: dict[str, Any], within: float = 20.0) -> dict[str, Any]:
        reply = await self.ask(subject, body, within)
        assert reply["ok"] is True, reply
        data: dict[str, Any] = reply["data"]
        return data

    async def land(self, callback_url: str) -> tuple[int, str]:
        """The end user's browser following the provider's redirect to toolbus's callback."""
        self.secrets.update(
            v for k, v in query(callback_url).items() if k in ("code", "state") and len(v) >= 16
        )
        async with httpx.AsyncClient() as http:
            response = await http.get(callback_url)
        self.pages.append(response.text)
        return response.status_code, response.text

    async def connect(self, body: dict[str, Any], login: str) -> dict[str, Any]:
        """credentials.connect, the user's consent, the callback; returns the connected event."""
        reply = await self.ok(self.subjects.credentials_connect, body)
        assert reply["status"] == "pending" and reply["authorizationUrl"].startswith(self.start)
        before = len(self.events["connected"])
        status, page = await self.land(await consent(reply["authorizationUrl"], login=login))
        assert (status, "Connected" in page) == (200, True), page
        await until(lambda: len(self.events["connected"]) > before, "the connected event")
        event = self.events["connected"][-1]
        assert event["data"]["connectionId"] == reply["connectionId"]
        return event

    async def run_events(self, run_id: str) -> list[dict[str, Any]]:
        return await stored_events(self.nc, js_name(self.prefix, "EVENTS"), self.subjects.run_events(run_id))


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def stack(service_env: dict[str, str], bus: Bus, redis_url: str) -> AsyncIterator[Stack]:
    prefix = bus.prefix("tboa")
    m2m = {
        "client_id": M2M_ID,
        "client_secret": M2M_SECRET,
        "grant_types": ["client_credentials"],
        "redirect_uris": [],
        "response_types": [],
    }
    other = {
        "client_id": OTHER_CLIENT,
        "token_endpoint_auth_method": "none",
        "grant_types": ["authorization_code", "refresh_token"],
        "redirect_uris": ["http://127.0.0.1:9/cb"],
    }
    port_a, port_b = free_port(), free_port()
    callback = f"http://127.0.0.1:{port_a}/oauth/callback"
    other["redirect_uris"] = [callback]
    async with AsyncExitStack() as exits:
        provider = await exits.enter_async_context(OidcProvider(access_ttl=TTL, clients=[m2m, other]))
        server = McpTestServer(name="gh")
        server.guard = resource_guard(
            provider.issuer,
            lambda: server.url,
            tool_scopes={"plain": "tools:admin"},  # a scope its metadata does not list
        )
        await exits.enter_async_context(server)
        env = {
            **service_env,
            "TOOLBUS_SUBJECT_PREFIX": prefix,
            "TOOLBUS_REDIS_PREFIX": prefix,
            "TOOLBUS_PARK_NOTIFY_DELAY": "100ms",
            "TOOLBUS_OAUTH_CALLBACK_URL": callback,
            "TOOLBUS_OAUTH_REFRESH_MARGIN": "1500ms",
            "TOOLBUS_OAUTH_REFRESH_INTERVAL": "100ms",
            "TOOLBUS_LOG_FORMAT": "json",
        }
        nc = await bus.connect("harness")
        s = Stack(nc, prefix, provider, server, callback)

        async def keep(kind: str) -> Any:
            async def on(msg: Any) -> None:
                s.events[kind].append(json.loads(msg.data))

            return on

        for kind, subject in (
            ("expired", s.subjects.credentials_expired),
            ("connected", s.subjects.credentials_connected),
            ("failed", s.subjects.credentials_failed),
        ):
            await nc.subscribe(subject, cb=await keep(kind))
        for name, port in (
            ("registry", None),
            ("credentials", port_a),
            ("credentials", port_b),
            ("dispatcher", None),
        ):
            proc = await exits.enter_async_context(
                bus.service(name, env, port=port) if port else bus.service(name, env)
            )
            s.logs.append(proc.log_path)
        try:
            yield s
        finally:
            await bus.drop_state(nc, redis_url, prefix)
            await nc.drain()


async def _m2m_token(provider: OidcProvider, resource: str) -> str:
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{provider.issuer}/token",
            data={
                "grant_type": "client_credentials",
                "resource": resource,
                "scope": "tools:read tools:write",
            },
            auth=(M2M_ID, M2M_SECRET),
        )
    response.raise_for_status()
    token: str = response.json()["access_token"]
    return token


async def _invoke(
    s: Stack, run_id: str, tool: str = "echo", key: str | None = None, text: str = "hi"
) -> dict[str, Any]:
    body: dict[str, Any] = {"runId": run_id, "tool": f"gh.{tool}", "input": {"text": text}}
    if key:
        body["idempotencyKey"] = key
    return await s.ok(s.subjects.calls_invoke, body, within=60)


async def test_1_a_server_that_takes_only_oauth_tokens_is_registered_and_kept_connected_at_the_toolset_level(
    stack: Stack,
) -> None:
    s = stack
    token = await _m2m_token(s.provider, s.server.url)
    s.secrets.add(token)
    toolset = await s.ok(
        s.subjects.toolsets_create,
        {
            "mcp": [{"name": "gh", "url": s.server.url}],
            "credentials": {"servers": {"gh": {"headers": {"Authorization": f"Bearer {token}"}}}},
        },
        within=60,
    )
    s.toolset_id = toolset["id"]
    assert sorted(t["name"] for t in toolset["tools"]) == ["gh.echo", "gh.fail", "gh.plain"]
    # Client credentials at the toolset level: connected at once, renewed by the service.
    reply = await s.ok(
        s.subjects.credentials_connect,
        {
            "toolsetId": s.toolset_id,
            "server": "gh",
            "grant": "clientCredentials",
            "client": {"clientId": M2M_ID, "clientSecret": M2M_SECRET},
        },
    )
    assert (
        reply["status"] == "connected"
        and reply["level"] == "toolset"
        and reply.get("authorizationUrl") is None
    )
    await asyncio.sleep(TTL + 1)  # the registration token has expired: only the connection's works
    run = await s.ok(s.subjects.runs_open, {"toolsetId": s.toolset_id})
    assert (await _invoke(s, run["runId"]))["outcome"]["status"] == "ok"
    status = await s.ok(s.subjects.credentials_status, {"toolsetId": s.toolset_id})
    assert [(c["server"], c["grant"], c["status"]) for c in status["connections"]] == [
        ("gh", "clientCredentials", "connected")
    ]
    await s.ok(s.subjects.runs_close, {"runId": run["runId"]})


async def test_2_an_end_user_and_a_run_connected_then_calls_use_their_tokens(stack: Stack) -> None:
    s = stack
    event = await s.connect({"toolsetId": s.toolset_id, "namespace": "user-42", "server": "gh"}, "user-42")
    assert event["data"]["level"] == "namespace" and event["data"]["namespace"] == "user-42"
    assert "tools:read" in event["data"]["scopes"]
    run = await s.ok(s.subjects.runs_open, {"toolsetId": s.toolset_id, "namespace": "user-42"})
    assert (await _invoke(s, run["runId"]))["outcome"]["status"] == "ok"
    status = await s.ok(s.subjects.credentials_status, {"toolsetId": s.toolset_id, "namespace": "user-42"})
    assert status["level"] == "namespace" and [c["server"] for c in status["connections"]] == ["gh"]

    other = await s.ok(s.subjects.runs_open, {"toolsetId": s.toolset_id, "namespace": "user-9"})
    event = await s.connect({"runId": other["runId"], "server": "gh"}, "user-9")
    assert event["data"]["level"] == "run" and event["data"]["runId"] == other["runId"]
    assert (await _invoke(s, other["runId"]))["outcome"]["status"] == "ok"
    await s.ok(s.subjects.runs_close, {"runId": other["runId"]})
    await s.ok(s.subjects.runs_close, {"runId": run["runId"]})


async def test_2b_the_sdk_connects_an_end_user_and_reports_the_connection(stack: Stack) -> None:
    from toolbus import InvalidRequest, Toolbus

    s = stack
    tb = Toolbus(s.nc, s.prefix, owns_connection=False)
    conn = await tb.namespaces.connect("user-sdk", s.toolset_id, "gh")
    assert conn.status == "pending" and conn.level == "namespace"
    assert conn.authorization_url is not None and conn.authorization_url.startswith(s.start)
    landing = await consent(conn.authorization_url, login="user-sdk")
    waiting = asyncio.ensure_future(conn.wait(30))
    assert (await s.land(landing))[0] == 200
    data = await waiting
    assert data["connectionId"] == conn.id and data["namespace"] == "user-sdk" and data["server"] == "gh"
    (listed,) = await tb.namespaces.connections("user-sdk", s.toolset_id)
    assert (
        listed["server"] == "gh"
        and listed["status"] == "connected"
        and listed["grant"] == "authorizationCode"
    )
    assert "tools:read" in listed["scopes"] and listed["expiresAt"] and listed["issuer"] == s.provider.issuer
    # A refused consent ends wait() with the reason.
    conn = await tb.namespaces.connect("user-sdk2", s.toolset_id, "gh")
    waiting = asyncio.ensure_future(conn.wait(30))
    await s.land(await consent(conn.authorization_url or "", deny=True))
    with pytest.raises(InvalidRequest) as refused:
        await waiting
    assert refused.value.details["error"] == "access_denied"


async def test_3_a_hundred_calls_across_token_lifetimes_none_parked_each_token_renewed_once(
    stack: Stack,
) -> None:
    s = stack
    before = await s.provider.stats()
    run = await s.ok(s.subjects.runs_open, {"toolsetId": s.toolset_id, "namespace": "user-42"})
    started = asyncio.get_running_loop().time()
    outcomes = []
    for i in range(100):
        outcomes.append((await _invoke(s, run["runId"], text=f"n{i}"))["outcome"]["status"])
        await asyncio.sleep(0.12)
    elapsed = asyncio.get_running_loop().time() - started
    after = await s.provider.stats()
    refreshes = after.get("refresh_token:ok", 0) - before.get("refresh_token:ok", 0)
    refused = after.get("refresh_token:error", 0) - before.get("refresh_token:error", 0)
    kinds = [e["type"] for e in await s.run_events(run["runId"])]
    parks = kinds.count("parked")
    live = len(
        (await s.ok(s.subjects.credentials_status, {"toolsetId": s.toolset_id, "namespace": "user-42"}))[
            "connections"
        ]
    ) + len(
        (await s.ok(s.subjects.credentials_status, {"toolsetId": s.toolset_id, "namespace": "user-sdk"}))[
            "connections"
        ]
    )
    print(
        f"\nrefresh test: {len(outcomes)} calls over {elapsed:.1f}s ({elapsed / TTL:.1f} access-token "
        f"lifetimes of {TTL}s); refresh grants at the provider {refreshes} (for {live} end-user "
        f"connections renewing meanwhile), refused {refused}, parks {parks}; two credentials replicas"
    )
    assert outcomes == ["ok"] * 100
    assert parks == 0
    assert refused == 0  # rotation: a second refresh with a used token would be refused (invalid_grant)
    assert refreshes >= int(elapsed / TTL)
    await s.ok(s.subjects.runs_close, {"runId": run["runId"]})


async def test_4_step_up_asks_for_the_scope_the_server_challenge_names(stack: Stack) -> None:
    """The tool needs `tools:admin`, which the server's metadata does not list: only its 403
    challenge names it. An end user is asked for the current scopes plus that one (not all the
    server offers); the toolset's client-credentials connection gets it with no one asked only
    once the operator allowed it (`maxScopes`), and parks the call with a notice before."""
    s = stack
    body = {"toolsetId": s.toolset_id, "namespace": "user-7", "server": "gh", "scopes": ["tools:read"]}
    refused = await s.ask(s.subjects.credentials_connect, {**body, "maxScopes": ["tools:admin"]})
    assert refused["ok"] is False and refused["error"]["code"] == "invalidRequest", refused
    assert refused["error"]["details"]["field"] == "maxScopes", refused
    await s.connect(body, "user-7")
    run = await s.ok(s.subjects.runs_open, {"toolsetId": s.toolset_id, "namespace": "user-7"})
    before = len(s.events["expired"])
    started = await s.ok(
        s.subjects.calls_start,
        {"runId": run["runId"], "tool": "gh.plain", "input": {"text": "w"}, "idempotencyKey": "k-step-up"},
    )
    await until(lambda: len(s.events["expired"]) > before, "credentials.expired for the step-up", limit=30)
    notice = s.events["expired"][-1]["data"]
    assert notice["callIds"] == [started["callId"]] and notice["namespace"] == "user-7"
    assert notice["authorizationUrl"].startswith(s.start)
    connected = len(s.events["connected"])
    status, page = await s.land(await consent(notice["authorizationUrl"], login="user-7"))
    assert status == 200, page
    await until(lambda: len(s.events["connected"]) > connected, "connected with the larger scope")
    granted = set(s.events["connected"][-1]["data"]["scopes"])
    assert {"tools:read", "tools:admin"} <= granted and "tools:write" not in granted, granted
    done = await s.ok(
        s.subjects.calls_invoke,
        {"runId": run["runId"], "tool": "gh.plain", "input": {"text": "w"}, "idempotencyKey": "k-step-up"},
        within=60,
    )
    assert done["callId"] == started["callId"] and done["outcome"]["status"] == "ok"
    await s.ok(s.subjects.runs_close, {"runId": run["runId"]})

    # Machine to machine: `tools:admin` is outside what the operator allowed at connect (the
    # server's `scopes_supported`), so the client-credentials token is not widened: the call parks
    # and a notice goes out (with no link: a person connects again).
    before = len(s.events["expired"])
    run = await s.ok(s.subjects.runs_open, {"toolsetId": s.toolset_id})
    started = await s.ok(
        s.subjects.calls_start,
        {"runId": run["runId"], "tool": "gh.plain", "input": {"text": "m"}, "idempotencyKey": "k-m2m"},
    )
    await until(
        lambda: len(s.events["expired"]) > before, "credentials.expired for the m2m step-up", limit=30
    )
    notice = s.events["expired"][-1]["data"]
    assert notice["callIds"] == [started["callId"]] and notice["level"] == "toolset", notice
    assert notice.get("authorizationUrl") is None
    status_now = await s.ok(s.subjects.credentials_status, {"toolsetId": s.toolset_id})
    assert "tools:admin" not in status_now["connections"][0]["scopes"]

    # Connected again with `maxScopes` allowing it: the parked call resumes, meets the challenge
    # again and this time the token is widened at once, with no one asked.
    before = len(s.events["expired"])
    await s.ok(
        s.subjects.credentials_connect,
        {
            "toolsetId": s.toolset_id,
            "server": "gh",
            "grant": "clientCredentials",
            "client": {"clientId": M2M_ID, "clientSecret": M2M_SECRET},
            "maxScopes": ["tools:admin"],
        },
    )
    done = await s.ok(
        s.subjects.calls_invoke,
        {"runId": run["runId"], "tool": "gh.plain", "input": {"text": "m"}, "idempotencyKey": "k-m2m"},
        within=60,
    )
    assert done["callId"] == started["callId"] and done["outcome"]["status"] == "ok", done
    await asyncio.sleep(0.5)  # past the notify delay: a notice would be out
    assert len(s.events["expired"]) == before
    status_now = await s.ok(s.subjects.credentials_status, {"toolsetId": s.toolset_id})
    assert "tools:admin" in status_now["connections"][0]["scopes"]
    await s.ok(s.subjects.runs_close, {"runId": run["runId"]})


async def test_5_a_revoked_grant_parks_the_call_and_connecting_again_resumes_it_with_its_key(
    stack: Stack,
) -> None:
    s = stack
    await s.connect({"toolsetId": s.toolset_id, "namespace": "user-5", "server": "gh"}, "user-5")
    run = await s.ok(s.subjects.runs_open, {"toolsetId": s.toolset_id, "namespace": "user-5"})
    assert (await _invoke(s, run["runId"]))["outcome"]["status"] == "ok"
    await s.provider.revoke_grants()  # every refresh token now refused
    before = len(s.events["expired"])
    await asyncio.sleep(TTL + 1)  # the last access token expires; its refresh was refused
    started = await s.ok(
        s.subjects.calls_start,
        {"runId": run["runId"], "tool": "gh.echo", "input": {"text": "late"}, "idempotencyKey": "k-revoked"},
    )
    await until(lambda: len(s.events["expired"]) > before, "credentials.expired after revocation", limit=30)
    notice = s.events["expired"][-1]["data"]
    assert notice["callIds"] == [started["callId"]] and notice["level"] == "namespace"
    assert notice["authorizationUrl"].startswith(s.start)
    got = await s.ok(s.subjects.calls_get, {"callId": started["callId"]})
    assert got["state"] == "parked"
    status = await s.ok(s.subjects.credentials_status, {"toolsetId": s.toolset_id, "namespace": "user-5"})
    assert status["connections"][0]["status"] == "expired"
    code, page = await s.land(await consent(notice["authorizationUrl"], login="user-5"))
    assert code == 200, page
    done = await s.ok(
        s.subjects.calls_invoke,
        {"runId": run["runId"], "tool": "gh.echo", "input": {"text": "late"}, "idempotencyKey": "k-revoked"},
        within=60,
    )
    assert done["callId"] == started["callId"] and done["outcome"]["status"] == "ok"
    mine = [c for c in s.server.calls_to("echo") if c.idempotency_key_header == "k-revoked"]
    assert [c.authorized for c in mine][-1] is True and sum(c.authorized for c in mine) == 1
    await s.ok(s.subjects.runs_close, {"runId": run["runId"]})


async def test_6_refused_consent_bad_state_forged_iss_wrong_client_and_a_down_provider_store_nothing(
    stack: Stack,
) -> None:
    s = stack
    target = {"toolsetId": s.toolset_id, "namespace": "user-x", "server": "gh"}

    async def failed_with(error: str, status: int, words: str, callback_url: str) -> None:
        before = len(s.events["failed"])
        code, page = await s.land(callback_url)
        assert code == status and words in page, page
        await until(lambda: len(s.events["failed"]) > before, f"credentials.failed {error}")
        assert s.events["failed"][-1]["data"]["error"] == error

    # The user refuses consent.
    reply = await s.ok(s.subjects.credentials_connect, target)
    await failed_with("access_denied", 400, "declined", await consent(reply["authorizationUrl"], deny=True))
    # No state; an unknown one.
    await failed_with("unknownState", 400, "no state", s.callback + "?code=abc")
    await failed_with("unknownState", 400, "already used or has expired", s.callback + "?code=abc&state=nope")
    # A connect link opened twice: the second time it is refused (single-use).
    reply = await s.ok(s.subjects.credentials_connect, target)
    await consent(reply["authorizationUrl"], login="user-x", deny=True)
    async with httpx.AsyncClient() as http:
        again = await http.get(reply["authorizationUrl"])
    assert again.status_code == 400 and "already used or has expired" in again.text
    # A replayed state: the first use connects, the second is refused.
    reply = await s.ok(s.subjects.credentials_connect, target)
    landing = await consent(reply["authorizationUrl"], login="user-x")
    assert (await s.land(landing))[0] == 200
    await failed_with("unknownState", 400, "already used", landing)
    # A forged iss (RFC 9207 mix-up).
    reply = await s.ok(s.subjects.credentials_connect, {**target, "namespace": "user-y"})
    landing = await consent(reply["authorizationUrl"], login="user-y")
    forged = f"{s.callback}?{httpx.QueryParams({**query(landing), 'iss': 'https://evil.example'})}"
    await failed_with("issuerMismatch", 400, "expected authorization server", forged)
    # A code issued to another client, sent with this flow's state.
    mine = await s.ok(s.subjects.credentials_connect, {**target, "namespace": "user-y"})
    theirs = await s.ok(
        s.subjects.credentials_connect,
        {**target, "namespace": "user-y", "client": {"clientId": OTHER_CLIENT}},
    )
    my_landing = query(await consent(mine["authorizationUrl"], login="user-y"))
    their_landing = query(await consent(theirs["authorizationUrl"], login="user-y"))
    s.secrets.update([my_landing["code"], their_landing["code"]])
    mixed = f"{s.callback}?{httpx.QueryParams({'code': their_landing['code'], 'state': my_landing['state'], 'iss': my_landing['iss']})}"
    await failed_with("exchangeFailed", 400, "did not give toolbus a token", mixed)
    # The provider is down when the code comes back.
    reply = await s.ok(s.subjects.credentials_connect, {**target, "namespace": "user-z"})
    landing = await consent(reply["authorizationUrl"], login="user-z")
    await s.provider.stop()
    try:
        await failed_with("providerUnavailable", 400, "did not give toolbus a token", landing)
    finally:
        await s.provider.start()
    # Nothing stored for any of them.
    for ns in ("user-y", "user-z"):
        status = await s.ok(s.subjects.credentials_status, {"toolsetId": s.toolset_id, "namespace": ns})
        assert status["connections"] == []


async def test_7_disconnect_revokes_and_nothing_secret_anywhere(
    stack: Stack, redis_url: str, bus: Bus
) -> None:
    s = stack
    from redis.asyncio import Redis

    redis = Redis.from_url(redis_url)
    # The provider restarted in test 6 with its in-memory storage: it forgot the clients that
    # registered dynamically, so toolbus's cached registration is dropped (registered again).
    async for key in redis.scan_iter(match=f"{s.prefix}:oauth:client:*"):
        await redis.delete(key)
    await s.connect({"toolsetId": s.toolset_id, "namespace": "user-8", "server": "gh"}, "user-8")
    before = (await s.provider.stats()).get("revocation:200", 0)
    reply = await s.ok(
        s.subjects.credentials_disconnect, {"toolsetId": s.toolset_id, "namespace": "user-8", "server": "gh"}
    )
    assert reply == {"level": "namespace", "server": "gh", "disconnected": True, "revoked": True}
    assert (await s.provider.stats()).get("revocation:200", 0) == before + 1
    status = await s.ok(s.subjects.credentials_status, {"toolsetId": s.toolset_id, "namespace": "user-8"})
    assert status["connections"] == []
    run = await s.ok(s.subjects.runs_open, {"toolsetId": s.toolset_id, "namespace": "user-8"})
    # No header of its own any more: the toolset-level (client credentials) token is used.
    assert (await _invoke(s, run["runId"]))["outcome"]["status"] == "ok"
    await s.ok(s.subjects.runs_close, {"runId": run["runId"]})

    guard_tokens = set(getattr(s.server.guard, "tokens", []))
    s.secrets.update(guard_tokens)
    assert len(guard_tokens) >= 2  # the tokens the server accepted (many in a whole-module run)
    texts = [json.dumps(s.replies), json.dumps(s.events), *s.pages]
    texts += [p.read_text(errors="replace") for p in s.logs if p.exists()]
    # JetStream: every message of the deployment's streams, read as a service (the harness role
    # reads EVENTS with direct gets only).
    owner = await bus.connect("dispatcher")
    try:
        for stream, nc in (("EVENTS", owner), ("INTERNAL", owner)):
            js = nc.jetstream()
            name = js_name(s.prefix, stream)
            info = await js.stream_info(name)
            assert info.state.messages > 0
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                texts.append((await js.get_msg(name, seq)).data.decode(errors="replace"))
    finally:
        await owner.drain()
    try:
        async for key in redis.scan_iter(match=f"{s.prefix}:*", count=500):
            texts.append(key.decode())
            kind = (await redis.type(key)).decode()  # type: ignore[no-untyped-call]
            if kind == "string":
                texts.append((await redis.get(key) or b"").decode(errors="replace"))
            elif kind == "hash":
                texts += [v.decode(errors="replace") for v in (await redis.hgetall(key)).values()]
            elif kind == "zset":
                texts += [v.decode(errors="replace") for v in await redis.zrange(key, 0, -1)]
            elif kind == "set":
                texts += [v.decode(errors="replace") for v in await redis.smembers(key)]
            elif kind == "list":
                texts += [v.decode(errors="replace") for v in await redis.lrange(key, 0, -1)]
    finally:
        await redis.aclose()  # type: ignore[attr-defined]
    leaked = sorted(
        {f"{secret[:8]}… in {text[:80]!r}" for secret in s.secrets for text in texts if secret in text}
    )
    assert leaked == [], f"secrets seen in the clear: {leaked}"
    assert len(s.secrets) >= 5
