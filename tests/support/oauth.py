"""A real OAuth 2.1 authorization server and MCP servers that accept only its tokens, for tests.

`OidcProvider` runs `oidc-provider` (npm, installed into .cache/npm by `make npm-tools`) with
tests/support/oidc_provider.mjs on a free port: PKCE required, refresh-token rotation, resource
indicators (JWT access tokens whose audience is the MCP server), dynamic registration,
revocation, client credentials, Client ID Metadata Documents, access tokens of a few seconds. `resource_guard` makes an
`McpTestServer` an OAuth resource server: 401 with `resource_metadata` without a valid token
(checked with PyJWT against the provider's JWKS, audience = the server's URL), 403
`insufficient_scope` when the token lacks the scope a tool needs, and its RFC 9728 metadata.
`consent` drives the provider's login and consent pages over HTTP as an end user would.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx
import jwt
from toolbus_devstack.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
NODE_MODULES = ROOT / ".cache" / "npm" / "node_modules"
SCRIPT = Path(__file__).with_name("oidc_provider.mjs")


def provider_available() -> bool:
    return (NODE_MODULES / "oidc-provider" / "lib" / "index.js").exists()


class OidcProvider:
    """`async with OidcProvider(access_ttl=5) as op:` `op.issuer`, `await op.stats()`,
    `await op.revoke_grants()`, `await op.stop()` / `start()` (a provider that is down)."""

    def __init__(
        self,
        *,
        access_ttl: int = 5,
        clients: list[dict[str, Any]] | None = None,
        accounts: dict[str, dict[str, Any]] | None = None,
        ca_file: Path | None = None,
    ) -> None:
        """`accounts`: login -> extra ID token claims (`groups`), for OpenID Connect sign-ins (the
        console). `ca_file`: a certificate the provider trusts when it fetches a Client ID Metadata
        Document over HTTPS (a test's own TLS server)."""
        self.access_ttl = access_ttl
        self.clients = clients or []
        self.accounts = accounts
        self.ca_file = ca_file
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> OidcProvider:
        env = {**os.environ, "NODE_MODULES": str(NODE_MODULES), "CLIENTS": json.dumps(self.clients)}
        if self.accounts is not None:
            env["ACCOUNTS"] = json.dumps(self.accounts)
        if self.ca_file is not None:
            env["NODE_EXTRA_CA_CERTS"] = str(self.ca_file)
        self._proc = await asyncio.to_thread(
            subprocess.Popen,
            ["node", str(SCRIPT), str(self.port), str(self.access_ttl)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(400):
            async with httpx.AsyncClient() as http:
                try:
                    if (await http.get(f"{self.issuer}/__stats")).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
            await asyncio.sleep(0.05)
        raise RuntimeError("oidc-provider did not start")

    async def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            await asyncio.to_thread(self._proc.wait, 10)
            self._proc = None

    async def __aenter__(self) -> OidcProvider:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stats(self) -> dict[str, int]:
        async with httpx.AsyncClient() as http:
            data: dict[str, int] = (await http.get(f"{self.issuer}/__stats")).json()
            return data

    async def revoke_grants(self) -> None:
        async with httpx.AsyncClient() as http:
            (await http.post(f"{self.issuer}/__revoke-grants")).raise_for_status()


def resource_guard(
    issuer: str, url: Callable[[], str], *, tool_scopes: dict[str, str] | None = None
) -> Callable[[str, str, dict[str, str], bytes], tuple[int, dict[str, str], bytes] | None]:
    """An MCP server's OAuth checks (see module docstring); `url()` is the server's MCP URL (its
    port is known only once it listens); `tool_scopes` maps a tool to the scope it needs."""
    jwks = jwt.PyJWKClient(f"{issuer}/jwks")
    needs = tool_scopes or {}
    tokens: list[str] = []

    def guard(
        method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes] | None:
        mcp = url()
        base = f"{urlsplit(mcp).scheme}://{urlsplit(mcp).netloc}"
        metadata = f"{base}/.well-known/oauth-protected-resource{urlsplit(mcp).path}"
        if method == "GET" and path.startswith("/.well-known/oauth-protected-resource"):
            doc = {
                "resource": mcp,
                "authorization_servers": [issuer],
                "scopes_supported": ["tools:read", "tools:write"],
                "bearer_methods_supported": ["header"],
            }
            return 200, {"content-type": "application/json"}, json.dumps(doc).encode()
        challenge = f'Bearer resource_metadata="{metadata}"'
        auth = headers.get("authorization", "")
        if not auth.startswith("Bearer "):
            return 401, {"www-authenticate": challenge}, b"no token"
        token = auth[len("Bearer ") :]
        try:
            key = jwks.get_signing_key_from_jwt(token)
            claims = jwt.decode(
                token, key.key, algorithms=["RS256", "PS256", "ES256"], audience=mcp, issuer=issuer
            )
        except jwt.PyJWTError as exc:
            return (
                401,
                {"www-authenticate": f'{challenge}, error="invalid_token"'},
                str(type(exc).__name__).encode(),
            )
        tokens.append(token)
        scopes = set(str(claims.get("scope", "")).split())
        try:
            message = json.loads(body) if body else {}
        except ValueError:
            message = {}
        if isinstance(message, dict) and message.get("method") == "tools/call":
            tool = str((message.get("params") or {}).get("name"))
            need = needs.get(tool)
            if need is not None and need not in scopes:
                return (
                    403,
                    {
                        "www-authenticate": f'Bearer error="insufficient_scope", scope="{need}", resource_metadata="{metadata}"'
                    },
                    b"insufficient scope",
                )
        return None

    guard.tokens = tokens  # type: ignore[attr-defined]
    return guard


async def consent(
    authorization_url: str,
    *,
    login: str = "user-42",
    deny: bool = False,
    verify: ssl.SSLContext | bool = True,
    callback: str = "/oauth/callback",
) -> str:
    """Open toolbus's connect link, log in and consent (or abort) on the provider's
    devInteractions pages over HTTP; returns the URL the provider redirects the user's browser to
    (toolbus's `callback` path, with code, state, iss), not yet opened."""
    async with httpx.AsyncClient(follow_redirects=False, timeout=10, verify=verify) as http:
        url = authorization_url
        for _ in range(20):
            response = await http.get(url)
            location = response.headers.get("location")
            if response.status_code in (302, 303) and location:
                target = str(urljoin(url, location))
                if urlsplit(target).path.endswith(callback):
                    return target
                url = target
                continue
            if response.status_code == 200 and "/interaction/" in url:
                if deny:
                    url = url.rstrip("/") + "/abort"
                    continue
                prompt = (
                    "login"
                    if 'name="login"' in response.text or 'name="password"' in response.text
                    else "consent"
                )
                form = {"prompt": prompt}
                if prompt == "login":
                    form.update(login=login, password="x")
                posted = await http.post(url, data=form)
                url = urljoin(url, posted.headers["location"])
                continue
            raise AssertionError(f"unexpected answer {response.status_code} at {url}")
    raise AssertionError("too many redirects")


def query(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
