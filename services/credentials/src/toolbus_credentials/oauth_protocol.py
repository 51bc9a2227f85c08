"""The OAuth client side of the MCP authorization spec, with no Redis or NATS in it: discovery
(RFC 9728 protected-resource metadata, RFC 8414 / OpenID discovery), the Client ID Metadata
Document toolbus serves (`client_metadata`), dynamic client registration (RFC 7591), the
authorization URL with PKCE S256, `state` and `resource` (RFC 8707), and the token endpoint's
grants (authorization code, refresh, client credentials: one `token_grant`) and revocation
(RFC 7009).

authlib builds and parses the protocol's messages (`prepare_grant_uri`, `prepare_token_request`,
`create_s256_code_challenge`, `generate_token`); httpx sends them. authlib's own httpx client is
not used: in authlib 1.9 it warns that httpx is deprecated in favour of httpx2, which toolbus does
not use. No token, code, verifier or secret is ever put in an `OAuthFailure` message.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from authlib.common.security import generate_token  # type: ignore[import-untyped]
from authlib.oauth2.rfc6749.parameters import prepare_grant_uri, prepare_token_request  # type: ignore[import-untyped]
from authlib.oauth2.rfc7636 import create_s256_code_challenge  # type: ignore[import-untyped]
from toolbus_contracts.errors import HostNotAllowed

log = logging.getLogger(__name__)

PERMANENT_ERRORS = frozenset(
    {"invalid_grant", "invalid_client", "unauthorized_client", "unsupported_grant_type"}
)
"""Token endpoint errors that no retry fixes: the user must connect again."""

_RESOURCE_METADATA = re.compile(r'resource_metadata="([^"]+)"')
_INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "toolbus-credentials", "version": "1"},
    },
}


class OAuthFailure(Exception):
    """A step of the OAuth flow failed. `error` is a short code (the provider's `error`, or
    `providerUnavailable`, `discoveryFailed`, ...); `permanent` says whether a retry can help."""

    def __init__(self, message: str, *, error: str, permanent: bool) -> None:
        super().__init__(message)
        self.error = error
        self.permanent = permanent


@dataclass(frozen=True, slots=True)
class ServerAuth:
    """What discovery found for one MCP server: its resource id and its authorization server."""

    resource: str
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    registration_endpoint: str | None
    revocation_endpoint: str | None
    scopes_supported: list[str]
    auth_methods: list[str]
    iss_parameter_supported: bool
    offline_access: bool
    client_id_metadata_document_supported: bool = False
    """The authorization server takes an HTTPS URL as `client_id` and fetches the client's
    metadata there (draft-ietf-oauth-client-id-metadata-document)."""


@dataclass(frozen=True, slots=True)
class ClientInfo:
    client_id: str
    client_secret: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class Tokens:
    access_token: str = field(repr=False)
    refresh_token: str | None = field(repr=False)
    expires_at: float | None
    scopes: list[str]


def new_state() -> str:
    return str(generate_token(43))


def new_verifier() -> str:
    return str(generate_token(64))


async def _send(
    http: httpx.AsyncClient,
    method: str,
    url: str,
    what: str,
    *,
    error: str = "providerUnavailable",
    **kwargs: Any,
) -> httpx.Response:
    """One HTTP request of the flow. No answer, or a host the deployment's egress policy refuses
    (the client's guarded transport checks each connection's address), is an `OAuthFailure`
    that a retry may mend (`error`, or `hostNotAllowed`)."""
    try:
        return await http.request(method, url, **kwargs)
    except HostNotAllowed:
        raise OAuthFailure(
            f"{what} ({urlsplit(url).hostname}) is refused by the deployment's egress policy",
            error="hostNotAllowed",
            permanent=False,
        ) from None
    except httpx.HTTPError as exc:
        raise OAuthFailure(
            f"{what} did not answer ({type(exc).__name__})", error=error, permanent=False
        ) from None


def _well_known(url: str, suffix: str) -> list[str]:
    """RFC 8414 / 9728 well-known URLs for `url`: the suffix inserted before the path, then at
    the root (and OpenID's form, the suffix after the path, for openid-configuration)."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    out = [urlunsplit((parts.scheme, parts.netloc, f"/.well-known/{suffix}{path}", "", ""))]
    if path:
        out.append(urlunsplit((parts.scheme, parts.netloc, f"/.well-known/{suffix}", "", "")))
        if suffix == "openid-configuration":
            out.append(urlunsplit((parts.scheme, parts.netloc, f"{path}/.well-known/{suffix}", "", "")))
    return out


async def _get_json(http: httpx.AsyncClient, url: str) -> dict[str, Any] | None:
    response = await _send(http, "GET", url, urlsplit(url).netloc, headers={"Accept": "application/json"})
    if response.status_code != 200:
        return None
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


async def discover(http: httpx.AsyncClient, server_url: str) -> ServerAuth:
    """The server's authorization server and what it supports (MCP spec: a request without a
    token, `resource_metadata` from the 401's WWW-Authenticate, else the well-known URLs)."""
    candidates: list[str] = []
    probe = await _send(
        http,
        "POST",
        server_url,
        "the MCP server",
        error="serverUnavailable",
        json=_INIT,
        headers={"Accept": "application/json, text/event-stream"},
    )
    if probe.status_code == 401:
        match = _RESOURCE_METADATA.search(probe.headers.get("www-authenticate", ""))
        if match:
            candidates.append(match.group(1))
    candidates += _well_known(server_url, "oauth-protected-resource")
    prm: dict[str, Any] | None = None
    for url in candidates:
        prm = await _get_json(http, url)
        if prm is not None and prm.get("authorization_servers"):
            break
    if not prm or not prm.get("authorization_servers"):
        raise OAuthFailure(
            "the MCP server publishes no protected-resource metadata (RFC 9728) naming an "
            "authorization server",
            error="discoveryFailed",
            permanent=True,
        )
    resource = str(prm.get("resource") or server_url)
    if resource.rstrip("/") != server_url.rstrip("/"):
        raise OAuthFailure(
            "the protected-resource metadata names another resource than the server's URL",
            error="discoveryFailed",
            permanent=True,
        )
    issuer = str(prm["authorization_servers"][0])
    meta: dict[str, Any] | None = None
    for url in _well_known(issuer, "oauth-authorization-server") + _well_known(
        issuer, "openid-configuration"
    ):
        meta = await _get_json(http, url)
        if meta is not None and meta.get("issuer"):
            break
    if not meta or not meta.get("token_endpoint") or not meta.get("authorization_endpoint"):
        raise OAuthFailure(
            "the authorization server publishes no metadata (RFC 8414 or OpenID discovery)",
            error="discoveryFailed",
            permanent=True,
        )
    if str(meta["issuer"]).rstrip("/") != issuer.rstrip("/"):
        raise OAuthFailure(
            "the authorization server's metadata names another issuer",
            error="discoveryFailed",
            permanent=True,
        )
    methods = meta.get("code_challenge_methods_supported") or []
    if "S256" not in methods:
        raise OAuthFailure(
            "the authorization server does not offer PKCE S256", error="discoveryFailed", permanent=True
        )
    scopes = [str(s) for s in prm.get("scopes_supported") or []]
    return ServerAuth(
        resource=resource,
        issuer=str(meta["issuer"]),
        authorization_endpoint=str(meta["authorization_endpoint"]),
        token_endpoint=str(meta["token_endpoint"]),
        registration_endpoint=meta.get("registration_endpoint"),
        revocation_endpoint=meta.get("revocation_endpoint"),
        scopes_supported=scopes,
        auth_methods=[
            str(m) for m in meta.get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
        ],
        iss_parameter_supported=bool(meta.get("authorization_response_iss_parameter_supported")),
        offline_access="offline_access" in (meta.get("scopes_supported") or []),
        client_id_metadata_document_supported=meta.get("client_id_metadata_document_supported") is True,
    )


def client_metadata(client_id: str, redirect_uri: str, client_name: str) -> dict[str, Any]:
    """toolbus's Client ID Metadata Document (draft-ietf-oauth-client-id-metadata-document):
    served at `client_id`, an HTTPS URL, for authorization servers that fetch it instead of
    registering toolbus; a public client (PKCE, no secret) of the authorization code grant."""
    return {
        "client_id": client_id,
        "client_name": client_name,
        "redirect_uris": [redirect_uri],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    }


async def register_client(
    http: httpx.AsyncClient, auth: ServerAuth, redirect_uri: str, client_name: str, *, confidential: bool
) -> ClientInfo:
    """Dynamic client registration (RFC 7591): a public client (PKCE, no secret) for the
    authorization code grant, or a confidential one for client credentials."""
    if not auth.registration_endpoint:
        raise OAuthFailure(
            "the authorization server offers no dynamic client registration: register toolbus as a "
            "client there and pass its id (and secret) in 'client'",
            error="registrationUnavailable",
            permanent=True,
        )
    body: dict[str, Any] = {
        "client_name": client_name,
        "redirect_uris": [redirect_uri],
        "grant_types": ["client_credentials"] if confidential else ["authorization_code", "refresh_token"],
        "response_types": [] if confidential else ["code"],
        "token_endpoint_auth_method": "client_secret_basic" if confidential else "none",
    }
    response = await _send(http, "POST", auth.registration_endpoint, "client registration", json=body)
    if response.status_code not in (200, 201):
        raise OAuthFailure(
            f"client registration refused (HTTP {response.status_code}{_error_of(response)})",
            error="registrationFailed",
            permanent=response.status_code < 500,
        )
    data = response.json()
    return ClientInfo(client_id=str(data["client_id"]), client_secret=data.get("client_secret"))


def authorization_url(
    auth: ServerAuth,
    client: ClientInfo,
    *,
    redirect_uri: str,
    state: str,
    verifier: str,
    scopes: list[str],
) -> str:
    extra: dict[str, Any] = {
        "code_challenge": create_s256_code_challenge(verifier),
        "code_challenge_method": "S256",
        "resource": auth.resource,
    }
    if "offline_access" in scopes:
        extra["prompt"] = "consent"  # OpenID: a refresh token for offline_access needs consent
    return str(
        prepare_grant_uri(
            auth.authorization_endpoint,
            client.client_id,
            "code",
            redirect_uri=redirect_uri,
            scope=" ".join(scopes) or None,
            state=state,
            **extra,
        )
    )


def _error_of(response: httpx.Response) -> str:
    """`: <error>` from an OAuth error body (the code only: descriptions may echo input)."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return ""
    return f": {error}" if isinstance(error, str) and re.fullmatch(r"[a-z_]{1,64}", error) else ""


def _client_auth(
    client: ClientInfo, auth_methods: list[str]
) -> tuple[dict[str, str], httpx.BasicAuth | None]:
    """How the client authenticates to the token and revocation endpoints: the body fields to
    add and the Basic credentials, if any (`client_secret_basic` unless only `_post` is offered;
    a public client sends its id)."""
    if client.client_secret is None:
        return {"client_id": client.client_id}, None
    if "client_secret_post" in auth_methods and "client_secret_basic" not in auth_methods:
        return {"client_id": client.client_id, "client_secret": client.client_secret}, None
    return {}, httpx.BasicAuth(client.client_id, client.client_secret)


async def token_grant(
    http: httpx.AsyncClient, auth: ServerAuth, client: ClientInfo, grant_type: str, **params: Any
) -> Tokens:
    """One request to the token endpoint, for any grant (`authorization_code` with `code`,
    `redirect_uri`, `code_verifier`; `refresh_token` with `refresh_token`; `client_credentials`
    with `scope`; each with `resource`): the tokens, or `OAuthFailure` with the provider's error
    code (`permanent` when no retry can help)."""
    body = prepare_token_request(grant_type, **{k: v for k, v in params.items() if v is not None})
    fields, basic = _client_auth(client, auth.auth_methods)
    if fields:
        body += "&" + str(httpx.QueryParams(fields))
    response = await _send(
        http,
        "POST",
        auth.token_endpoint,
        "the token endpoint",
        content=body,
        headers={"Accept": "application/json", "Content-Type": "application/x-www-form-urlencoded"},
        auth=basic or httpx.USE_CLIENT_DEFAULT,
    )
    if response.status_code != 200:
        code = _error_of(response)[2:] or ("serverError" if response.status_code >= 500 else "tokenRefused")
        raise OAuthFailure(
            f"the token endpoint refused the {grant_type} grant (HTTP {response.status_code}: {code})",
            error=code,
            permanent=code in PERMANENT_ERRORS
            or (400 <= response.status_code < 500 and code == "tokenRefused"),
        )
    data = response.json()
    if str(data.get("token_type", "")).lower() != "bearer" or not data.get("access_token"):
        raise OAuthFailure(
            "the token endpoint answered no bearer access token", error="tokenRefused", permanent=True
        )
    expires_in = data.get("expires_in")
    scope = data.get("scope")
    return Tokens(
        access_token=str(data["access_token"]),
        refresh_token=data.get("refresh_token"),
        expires_at=time.time() + float(expires_in) if isinstance(expires_in, int | float) else None,
        scopes=str(scope).split() if isinstance(scope, str) else [],
    )


async def revoke(
    http: httpx.AsyncClient, auth: ServerAuth, client: ClientInfo, *, token: str, hint: str
) -> bool:
    """RFC 7009 at `auth.revocation_endpoint`, the client authenticated as at the token
    endpoint; True when the server answered 200."""
    if not auth.revocation_endpoint:
        return False
    fields, basic = _client_auth(client, auth.auth_methods)
    try:
        response = await _send(
            http,
            "POST",
            auth.revocation_endpoint,
            "the revocation endpoint",
            data={"token": token, "token_type_hint": hint, **fields},
            auth=basic or httpx.USE_CLIENT_DEFAULT,
        )
    except OAuthFailure:
        return False
    if response.status_code != 200:
        log.warning(
            "token revocation refused",
            extra={"status": response.status_code, "error": _error_of(response)[2:]},
        )
    return response.status_code == 200
