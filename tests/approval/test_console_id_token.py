"""The console's ID token check (`OidcClient.verify`), against keys a real HTTP server publishes:
a token passes only when signed by a published key with an asymmetric algorithm, for this client,
from this issuer, not expired, and carrying this sign-in's nonce."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import jwt
import pytest
import pytest_asyncio
from cryptography.hazmat.primitives.asymmetric import rsa
from toolbus_approval.console.oidc import OidcClient, SignInFailed
from toolbus_common.keys import Keys

from tests.support.http_servers import serve_in_thread

ISSUER = "https://login.example.test"
CLIENT = "toolbus-console"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _jwks() -> bytes:
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(KEY.public_key()))
    return json.dumps({"keys": [{**public, "kid": "k1", "use": "sig", "alg": "RS256"}]}).encode()


class Jwks(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = _jwks()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture(scope="module")
def jwks_url() -> Iterator[str]:
    with serve_in_thread(ThreadingHTTPServer(("127.0.0.1", 0), Jwks)) as port:
        yield f"http://127.0.0.1:{port}/jwks"


@pytest_asyncio.fixture(loop_scope="session")
async def client() -> AsyncIterator[OidcClient]:
    async with httpx.AsyncClient() as http:
        yield OidcClient(
            issuer=ISSUER,
            client_id=CLIENT,
            client_secret=None,
            redirect_uri="http://127.0.0.1/auth/callback",
            scopes="openid",
            groups_claim="groups",
            redis=None,  # type: ignore[arg-type]  # verify() reads no Redis
            keys=Keys("unused"),
            http=http,
        )


def token(key: Any = KEY, alg: str = "RS256", kid: str = "k1", **claims: Any) -> str:
    now = int(time.time())
    body = {"iss": ISSUER, "aud": CLIENT, "sub": "alice", "iat": now, "exp": now + 300, "nonce": "n-1"}
    body.update(claims)
    return jwt.encode(
        {k: v for k, v in body.items() if v is not None}, key, algorithm=alg, headers={"kid": kid}
    )


def _hmac_with_public_key() -> str:
    """The algorithm-confusion forgery: HS256 keyed with the provider's public key (PyJWT itself
    refuses to sign it, so it is put together by hand)."""
    import base64
    import hashlib
    import hmac

    from cryptography.hazmat.primitives import serialization

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    now = int(time.time())
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "k1"}).encode())
    body = b64(
        json.dumps(
            {"iss": ISSUER, "aud": CLIENT, "sub": "mallory", "iat": now, "exp": now + 300, "nonce": "n-1"}
        ).encode()
    )
    secret = KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    signature = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(signature)}"


async def test_a_token_of_the_provider_for_this_sign_in_passes(client: OidcClient, jwks_url: str) -> None:
    meta = {"issuer": ISSUER, "jwks_uri": jwks_url, "id_token_signing_alg_values_supported": ["RS256"]}
    claims = await client.verify(token(groups=["shop"]), meta, nonce="n-1")
    assert claims["sub"] == "alice" and claims["groups"] == ["shop"]


@pytest.mark.parametrize(
    ("why", "make"),
    [
        ("another audience", lambda: token(aud="someone-else")),
        ("another issuer", lambda: token(iss="https://evil.example.test")),
        ("expired", lambda: token(exp=int(time.time()) - 3600, iat=int(time.time()) - 7200)),
        ("no expiry", lambda: token(exp=None)),
        ("another sign-in's nonce", lambda: token(nonce="n-2")),
        ("no nonce", lambda: token(nonce=None)),
        ("signed by a key the provider does not publish", lambda: token(key=OTHER)),
        ("the public key used as an HMAC secret", lambda: _hmac_with_public_key()),
        ("not a JWT", lambda: "not-a-token"),
    ],
)
async def test_a_token_that_does_not_hold_is_refused(
    client: OidcClient, jwks_url: str, why: str, make: Any
) -> None:
    meta = {
        "issuer": ISSUER,
        "jwks_uri": jwks_url,
        "id_token_signing_alg_values_supported": ["RS256", "HS256"],
    }
    with pytest.raises(SignInFailed):
        await client.verify(make(), meta, nonce="n-1")
