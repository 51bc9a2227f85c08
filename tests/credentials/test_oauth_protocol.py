"""The OAuth client's message building, with no network: well-known URLs (RFC 8414 / 9728 /
OpenID), the authorization URL (PKCE S256 over the verifier, state, resource, scopes), and error
bodies reduced to their code (a description may echo input)."""

from __future__ import annotations

import base64
import hashlib
from urllib.parse import parse_qs, urlsplit

import httpx
from toolbus_credentials import oauth_protocol as proto
from toolbus_credentials.oauth_protocol import ClientInfo, ServerAuth

AUTH = ServerAuth(
    resource="https://mcp.example.com/mcp",
    issuer="https://as.example.com",
    authorization_endpoint="https://as.example.com/authorize",
    token_endpoint="https://as.example.com/token",
    registration_endpoint=None,
    revocation_endpoint=None,
    scopes_supported=["repo"],
    auth_methods=["none"],
    iss_parameter_supported=True,
    offline_access=True,
)


def test_well_known_urls_insert_the_suffix_before_the_path_then_try_the_root() -> None:
    assert proto._well_known("https://mcp.example.com/mcp", "oauth-protected-resource") == [
        "https://mcp.example.com/.well-known/oauth-protected-resource/mcp",
        "https://mcp.example.com/.well-known/oauth-protected-resource",
    ]
    assert proto._well_known("https://as.example.com/tenant", "openid-configuration") == [
        "https://as.example.com/.well-known/openid-configuration/tenant",
        "https://as.example.com/.well-known/openid-configuration",
        "https://as.example.com/tenant/.well-known/openid-configuration",
    ]
    assert proto._well_known("https://as.example.com", "oauth-authorization-server") == [
        "https://as.example.com/.well-known/oauth-authorization-server"
    ]


def test_the_authorization_url_carries_pkce_s256_state_resource_and_scopes() -> None:
    verifier, state = proto.new_verifier(), proto.new_state()
    assert len(verifier) == 64 and len(state) == 43 and verifier != proto.new_verifier()
    url = proto.authorization_url(
        AUTH,
        ClientInfo("cid"),
        redirect_uri="https://tb.example.com/oauth/callback",
        state=state,
        verifier=verifier,
        scopes=["repo", "offline_access"],
    )
    parts = urlsplit(url)
    q = {k: v[0] for k, v in parse_qs(parts.query).items()}
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    assert f"{parts.scheme}://{parts.netloc}{parts.path}" == AUTH.authorization_endpoint
    assert q == {
        "response_type": "code",
        "client_id": "cid",
        "redirect_uri": "https://tb.example.com/oauth/callback",
        "scope": "repo offline_access",
        "state": state,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "resource": "https://mcp.example.com/mcp",
        "prompt": "consent",
    }
    assert verifier not in url


def test_an_error_body_gives_its_code_only() -> None:
    echoed = httpx.Response(400, json={"error": "invalid_grant", "error_description": "token tok-123 bad"})
    assert proto._error_of(echoed) == ": invalid_grant"
    odd = httpx.Response(400, json={"error": "tok-123 <script>"})
    assert proto._error_of(odd) == ""
    assert proto._error_of(httpx.Response(500, text="not json")) == ""


def test_the_client_authenticates_as_the_server_offers() -> None:
    public = proto._client_auth(ClientInfo("cid"), ["client_secret_basic"])
    assert public == ({"client_id": "cid"}, None)
    fields, basic = proto._client_auth(
        ClientInfo("cid", "s3cret"), ["client_secret_basic", "client_secret_post"]
    )
    assert fields == {} and isinstance(basic, httpx.BasicAuth)
    assert proto._client_auth(ClientInfo("cid", "s3cret"), ["client_secret_post"]) == (
        {"client_id": "cid", "client_secret": "s3cret"},
        None,
    )


def test_the_client_id_metadata_document_is_a_public_client_of_the_code_grant() -> None:
    url = "https://tb.example.com/oauth/client-metadata.json"
    document = proto.client_metadata(url, "https://tb.example.com/oauth/callback", "toolbus")
    assert document["client_id"] == url and document["token_endpoint_auth_method"] == "none"
    assert document["redirect_uris"] == ["https://tb.example.com/oauth/callback"]
    assert "client_secret" not in document
    from toolbus_credentials.oauth import client_metadata_url

    assert client_metadata_url("https://tb.example.com/oauth/callback") == url
    assert client_metadata_url("http://127.0.0.1:8084/oauth/callback") is None  # needs HTTPS
    assert client_metadata_url(None) is None
