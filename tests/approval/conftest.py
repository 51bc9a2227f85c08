"""The approvals console's tests: a real OpenID Connect provider (oidc-provider from npm, with
accounts whose ID tokens carry a `groups` claim), and the approval service's console settings
pointing at it, each module on a subject and key prefix of its own."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest_asyncio

from tests.support.gates import missing
from tests.support.infra import free_port, unique_prefix
from tests.support.oauth import OidcProvider, consent, provider_available

CLIENT_ID = "toolbus-console"
TOOLSET_ID = "ts_" + "0" * 16
ACCOUNTS = {
    "alice": {"groups": ["shop"]},
    "bob": {"groups": ["elsewhere"]},
    "carol": {"groups": ["shop-toolset"]},
}
"""alice decides the namespace `shop`; bob only `elsewhere`; carol only toolset `TOOLSET_ID` in `shop`."""
GROUPS = {
    "shop": {"namespaces": ["shop"]},
    "elsewhere": {"namespaces": ["elsewhere"]},
    "shop-toolset": {"toolsets": [TOOLSET_ID], "namespaces": ["shop"]},
}


@dataclass
class ConsoleSetup:
    """One console's settings and the provider it signs people in with."""

    prefix: str
    port: int
    client_secret: str
    dev_token: str
    provider: OidcProvider

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, service_env: dict[str, str]) -> dict[str, str]:
        return {
            **service_env,
            "TOOLBUS_SUBJECT_PREFIX": self.prefix,
            "TOOLBUS_REDIS_PREFIX": self.prefix,
            "TOOLBUS_LOG_LEVEL": "WARNING",
            "TOOLBUS_APPROVAL_SWEEP_INTERVAL": "0.2",
            "TOOLBUS_CONSOLE_PORT": str(self.port),
            "TOOLBUS_CONSOLE_URL": self.url,
            "TOOLBUS_CONSOLE_OIDC_ISSUER": self.provider.issuer,
            "TOOLBUS_CONSOLE_OIDC_CLIENT_ID": CLIENT_ID,
            "TOOLBUS_CONSOLE_OIDC_CLIENT_SECRET": self.client_secret,
            "TOOLBUS_CONSOLE_OIDC_SCOPES": "openid profile groups",
            "TOOLBUS_CONSOLE_GROUPS": json.dumps(GROUPS),
            "TOOLBUS_CONSOLE_DEV_TOKEN": self.dev_token,
        }


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def console_setup() -> AsyncIterator[ConsoleSetup]:
    if not provider_available():
        missing("oidc-provider is not installed (make npm-tools)")
    port = free_port()
    secret = secrets.token_urlsafe(24)
    client = {
        "client_id": CLIENT_ID,
        "client_secret": secret,
        "redirect_uris": [f"http://127.0.0.1:{port}/auth/callback"],
        "grant_types": ["authorization_code"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "client_secret_basic",
    }
    async with OidcProvider(clients=[client], accounts=ACCOUNTS) as provider:
        yield ConsoleSetup(unique_prefix("tbcn"), port, secret, secrets.token_urlsafe(18), provider)


def csrf_of(page: str) -> str:
    """The CSRF token a console page carries (its `<meta name="csrf-token">`)."""
    marker = '<meta name="csrf-token" content="'
    start = page.index(marker) + len(marker)
    return page[start : page.index('"', start)]


async def sign_in(setup: ConsoleSetup, login: str) -> httpx.AsyncClient:
    """A browser-like client (cookies kept) signed in to the console as `login` through the
    provider's login and consent pages."""
    client = httpx.AsyncClient(base_url=setup.url, follow_redirects=False, timeout=15)
    started = await client.get("/login/oidc")
    assert started.status_code == 303, started.text
    back = await consent(started.headers["location"], login=login, callback="/auth/callback")
    done = await client.get(back)
    assert done.status_code == 303 and done.headers["location"] == "/", done.text
    return client


def decide_form(csrf: str, decision: str, **more: Any) -> dict[str, Any]:
    return {"csrf": csrf, "decision": decision, **more}
