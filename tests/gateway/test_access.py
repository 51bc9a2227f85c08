"""Who may connect: tokens toolbus issues (none, unknown, expired, revoked, for another toolset),
JWTs of the identity provider checked against its JWKS, the protected-resource metadata; and
malformed requests answered with a JSON-RPC error or a tool error, never a 500 or a traceback."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from redis.asyncio import Redis
from toolbus_contracts.gateway import TokenCreateRequest
from toolbus_gateway.tokens import TokenStore

from tests.gateway.conftest import AUDIENCE, ISSUER, Deployment, mcp_client
from tests.support.infra import drop_redis_keys, unique_prefix

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

OTHER_TOOLSET = "ts_" + "0" * 64
GATEWAY_DOCS = Path(__file__).resolve().parents[2] / "docs" / "gateway.md"
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
LIST: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/list",
    "params": {
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        }
    },
}


async def _post(url: str, token: str | None, body: Any = LIST, raw: bytes | None = None) -> httpx.Response:
    headers = dict(HEADERS, **({"Authorization": f"Bearer {token}"} if token else {}))
    headers["Mcp-Protocol-Version"] = "2026-07-28"
    headers["Mcp-Method"] = body.get("method", "") if isinstance(body, dict) else ""
    async with httpx.AsyncClient(timeout=10) as http:
        if raw is not None:
            return await http.post(url, content=raw, headers=headers)
        return await http.post(url, json=body, headers=headers)


async def test_no_token_is_401_with_the_resource_metadata(deployment: Deployment, toolset: str) -> None:
    reply = await _post(deployment.url(toolset), None)
    assert reply.status_code == 401
    challenge = reply.headers["www-authenticate"]
    assert challenge.startswith('Bearer realm="toolbus"')
    metadata_url = f"{deployment.gateway.url}/.well-known/oauth-protected-resource/mcp/{toolset}"
    assert f'resource_metadata="{metadata_url}"' in challenge
    async with httpx.AsyncClient() as http:
        metadata = (await http.get(metadata_url)).json()
    assert metadata["resource"] == deployment.url(toolset)
    assert metadata["authorization_servers"] == [ISSUER]


async def test_unknown_expired_and_revoked_tokens_are_401(deployment: Deployment, toolset: str) -> None:
    assert (await _post(deployment.url(toolset), "tbg_not-a-token")).status_code == 401
    short = await deployment.token([toolset], ttl="3s")
    assert (await _post(deployment.url(toolset), short)).status_code == 200
    await asyncio.sleep(3.2)
    expired = await _post(deployment.url(toolset), short)
    assert expired.status_code == 401 and 'error="invalid_token"' in expired.headers["www-authenticate"]
    token = await deployment.token([toolset], namespace="revoked-user")
    listed = await deployment.ok(deployment.subjects.tokens_list, {"namespace": "revoked-user"})
    assert [t["namespace"] for t in listed["tokens"]] == ["revoked-user"]
    assert token not in str(listed)  # only the hash is stored, never shown again
    token_id = listed["tokens"][0]["id"]
    assert (await _post(deployment.url(toolset), token)).status_code == 200
    assert (await deployment.ok(deployment.subjects.tokens_revoke, {"id": token_id})) == {
        "id": token_id,
        "revoked": True,
    }
    assert (await _post(deployment.url(toolset), token)).status_code == 401
    again = await deployment.ok(deployment.subjects.tokens_list, {"namespace": "revoked-user"})
    assert again["tokens"] == []


async def test_a_token_revoked_through_another_replica_is_refused_within_the_cache_time(
    redis_url: str,
) -> None:
    """Two gateways' token stores on one Redis: the one that revokes refuses the token at once,
    the other once its cached check is `cache_seconds` old."""
    prefix = unique_prefix("tbgwtc")
    redis: Redis[bytes] = Redis.from_url(redis_url)
    here, there = (TokenStore(redis, prefix, cache_seconds=3.0) for _ in range(2))
    try:
        issued = await there.create(TokenCreateRequest(namespace="u-1", toolsets=[OTHER_TOOLSET]))
        assert await here.check(issued.token) is not None
        await there.revoke(issued.info.id)
        assert await there.check(issued.token) is None
        assert await here.check(issued.token) is not None  # checked under 3 s ago
        await asyncio.sleep(3.1)
        assert await here.check(issued.token) is None
    finally:
        await redis.aclose()  # type: ignore[attr-defined]  # redis>=5; stubs lag
        await drop_redis_keys(redis_url, prefix)


@pytest.mark.parametrize("resume", ["before_delete", "after_delete", "after_revoke"])
async def test_a_token_revoked_during_a_check_is_refused_here_once_revoke_returns(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, resume: str
) -> None:
    """A check whose Redis GET read the record before the revoke's DELETE, resuming before the
    DELETE, between it and the revoke's end, or after, leaves nothing cached: refused at once."""
    prefix = unique_prefix("tbgwrv")
    redis: Redis[bytes] = Redis.from_url(redis_url)
    store = TokenStore(redis, prefix, cache_seconds=60.0)
    read, release = asyncio.Event(), asyncio.Event()
    real_get, real_pipeline = redis.get, redis.pipeline

    async def paused_get(key: str) -> bytes | None:
        raw = await real_get(key)
        read.set()
        await release.wait()
        return raw

    def pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = real_pipeline(*args, **kwargs)
        real_execute = pipe.execute

        async def execute(*a: Any, **kw: Any) -> Any:
            if resume == "before_delete":
                release.set()
                await checking
            result = await real_execute(*a, **kw)
            if resume == "after_delete":
                release.set()
                await checking
            return result

        monkeypatch.setattr(pipe, "execute", execute)
        return pipe

    try:
        issued = await store.create(TokenCreateRequest(namespace="u-1", toolsets=[OTHER_TOOLSET]))
        monkeypatch.setattr(redis, "get", paused_get)
        monkeypatch.setattr(redis, "pipeline", pipeline)
        checking = asyncio.ensure_future(store.check(issued.token))
        await read.wait()  # the check has read the still-present record
        await store.revoke(issued.info.id)
        release.set()
        assert (await checking) is not None  # it began before the revoke
        monkeypatch.setattr(redis, "get", real_get)
        assert await store.check(issued.token) is None
    finally:
        await redis.aclose()  # type: ignore[attr-defined]  # redis>=5; stubs lag
        await drop_redis_keys(redis_url, prefix)


async def test_a_token_for_another_toolset_is_403(deployment: Deployment, toolset: str) -> None:
    token = await deployment.token([OTHER_TOOLSET])
    reply = await _post(deployment.url(toolset), token)
    assert reply.status_code == 403
    assert 'error="insufficient_scope"' in reply.headers["www-authenticate"]


async def test_a_never_registered_toolset_the_token_does_not_name_is_403_as_docs_say(
    deployment: Deployment, toolset: str
) -> None:
    """docs/gateway.md: 403 whether the toolset exists or not, so no token learns which do."""
    token = await deployment.token([toolset])
    never = "ts_" + "1" * 64
    reply = await _post(deployment.url(never), token)
    assert reply.status_code == 403
    assert 'error="insufficient_scope"' in reply.headers["www-authenticate"]
    docs = await asyncio.to_thread(GATEWAY_DOCS.read_text)
    assert "whether the toolset exists or not" in docs


def _claims(toolset: str, **overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    claims = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "jwt-user",
        "exp": now + 60,
        "iat": now,
        "toolbus_toolsets": [toolset],
    }
    claims.update(overrides)
    return claims


async def test_a_jwt_of_the_identity_provider_gives_its_namespace(
    deployment: Deployment, toolset: str
) -> None:
    jwt_token = deployment.jwks.token(_claims(toolset))
    async with mcp_client(deployment.url(toolset), jwt_token) as client:
        result = await client.call_tool("shop.echo", {"text": "as jwt"})
    assert result.structured_content == {"text": "as jwt"}
    assert result.meta is not None
    run_id = result.meta["toolbus/runId"]
    # The run is the JWT subject's: opening it for anyone else is refused.
    reply = await deployment.nc.request(
        deployment.subjects.runs_open,
        f'{{"toolsetId": "{toolset}", "namespace": "someone-else", "runId": "{run_id}"}}'.encode(),
        timeout=10,
    )
    assert b'"conflict"' in reply.data


@pytest.mark.parametrize(
    ("why", "overrides", "status"),
    [
        ("expired", {"exp": int(time.time()) - 120}, 401),
        ("wrong audience", {"aud": "someone-else"}, 401),
        ("wrong issuer", {"iss": "https://evil.example"}, 401),
        ("another toolset", {"toolbus_toolsets": [OTHER_TOOLSET]}, 403),
    ],
)
async def test_refused_jwts(
    deployment: Deployment, toolset: str, why: str, overrides: dict[str, Any], status: int
) -> None:
    reply = await _post(deployment.url(toolset), deployment.jwks.token(_claims(toolset, **overrides)))
    assert reply.status_code == status, why


async def test_a_jwt_signed_by_another_key_is_401(deployment: Deployment, toolset: str) -> None:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    reply = await _post(deployment.url(toolset), deployment.jwks.token(_claims(toolset), key=other))
    assert reply.status_code == 401


@pytest.mark.parametrize(
    ("what", "raw", "body"),
    [
        ("bad JSON", b'{"jsonrpc": "2.0", "id": 1, "method": ', None),
        ("unknown method", None, {**LIST, "method": "tools/frobnicate"}),
        ("not JSON-RPC", None, {"hello": "world"}),
    ],
)
async def test_malformed_requests_get_a_jsonrpc_error(
    deployment: Deployment, toolset: str, what: str, raw: bytes | None, body: Any
) -> None:
    token = await deployment.token([toolset])
    reply = await _post(deployment.url(toolset), token, body if body is not None else LIST, raw=raw)
    assert reply.status_code < 500, what
    assert "Traceback" not in reply.text and 'File "' not in reply.text
    assert reply.json()["error"]["code"] < 0, what


async def test_a_body_over_the_limit_is_413(deployment: Deployment, toolset: str) -> None:
    token = await deployment.token([toolset])
    big = {**LIST, "params": {**LIST["params"], "pad": "x" * (70 * 1024)}}
    reply = await _post(deployment.url(toolset), token, big)
    assert reply.status_code == 413
    assert reply.json()["error"]["code"] < 0


async def test_an_unknown_toolset_is_404(deployment: Deployment) -> None:
    token = await deployment.token([OTHER_TOOLSET])
    assert (await _post(deployment.url(OTHER_TOOLSET), token)).status_code == 404
    assert (await _post(f"{deployment.gateway.url}/mcp/not-a-toolset", token)).status_code == 404
