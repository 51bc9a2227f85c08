"""Credential bodies: headers per MCP server. Header values are secrets and never printed."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, SecretStr, ValidationError, field_serializer, field_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from toolbus_contracts.base import WireModel
from toolbus_contracts.names import Namespace, RunId, ToolsetId

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_FORBIDDEN_NAMES = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "upgrade",
        "te",
        "trailer",
        "keep-alive",
        "proxy-connection",
        "content-type",
        "accept",
        "mcp-session-id",
        "mcp-protocol-version",
        "idempotency-key",
    }
)


def _check_header_name(name: str) -> str:
    if len(name) > HEADER_NAME_MAX:
        raise ValueError(f"header name '{name[:40]}…' is longer than {HEADER_NAME_MAX} characters")
    if not _TOKEN.fullmatch(name):
        raise ValueError(f"header name '{name[:40]}' is not an HTTP token")
    if name.lower() in _FORBIDDEN_NAMES:
        raise ValueError(f"header '{name}' is set by toolbus and cannot be given as a credential")
    return name


HEADER_VALUE_MAX = 8192
"""The longest credential header value: what common servers take in one header line (nginx's
default buffer is 8 KiB; Node answers 431 past 16 KiB of headers in all)."""
HEADERS_MAX = 64
HEADERS_TOTAL_MAX = 12288
"""Bytes of one server's credential headers together (`name: value` lines): Node's HTTP server
takes 16 KiB of request line and headers in all, and toolbus sends a few hundred bytes of its own."""
HEADER_NAME_MAX = 256


def _check_header_value(value: SecretStr) -> SecretStr:
    raw = value.get_secret_value()
    if len(raw) > HEADER_VALUE_MAX:
        raise ValueError(f"a header value must be at most {HEADER_VALUE_MAX} characters, not {len(raw)}")
    if any((ord(c) < 0x20 and c != "\t") or 0x7F <= ord(c) <= 0x9F for c in raw):
        raise ValueError("a header value must not contain control characters (C0, DEL or C1)")
    if raw == "" or raw != raw.strip(" \t"):
        raise ValueError("a header value must be non-empty with no leading or trailing space or tab")
    try:
        raw.encode("latin-1")
    except UnicodeEncodeError:
        raise ValueError("a header value must be Latin-1 text") from None
    return value


HeaderName = Annotated[str, AfterValidator(_check_header_name)]
HeaderValue = Annotated[SecretStr, AfterValidator(_check_header_value)]


class ServerCredentials(WireModel):
    headers: dict[HeaderName, HeaderValue] = Field(min_length=1, max_length=HEADERS_MAX)

    @field_validator("headers")
    @classmethod
    def _fits_a_request(cls, headers: dict[str, SecretStr]) -> dict[str, SecretStr]:
        names = [k.lower() for k in headers]
        twice = next((k for k in headers if names.count(k.lower()) > 1), None)
        if twice is not None:  # HTTP header names are case-insensitive: which would be sent?
            problem = PydanticCustomError("value_error", "given twice (header names are case-insensitive)")
            raise ValidationError.from_exception_data(  # named as the header's own field
                "headers", [InitErrorDetails(type=problem, loc=(twice,), input=twice)]
            )
        total = sum(len(k) + len(v.get_secret_value()) + 4 for k, v in headers.items())  # ": " and CRLF
        if total > HEADERS_TOTAL_MAX:  # servers refuse such requests (431): no call could succeed
            raise ValueError(
                f"the headers take {total} bytes as request lines, over the {HEADERS_TOTAL_MAX} bytes "
                "toolbus sends a server"
            )
        return headers

    @field_serializer("headers", when_used="always")
    def _hide(self, headers: dict[str, SecretStr]) -> dict[str, str]:
        # Serialisation is for storage (encrypted) and for the MCP request; repr/str stay masked.
        return {k: v.get_secret_value() for k, v in headers.items()}

    def plain_headers(self) -> dict[str, str]:
        return {k: v.get_secret_value() for k, v in self.headers.items()}


class Credentials(WireModel):
    """`{"servers": {"github": {"headers": {"Authorization": "…"}}}}`."""

    servers: dict[str, ServerCredentials]


CredentialLevel = Literal["toolset", "namespace", "run"]


class ToolsetCredentialsSetRequest(WireModel):
    toolset_id: ToolsetId
    credentials: Credentials


class NamespaceCredentialsSetRequest(WireModel):
    namespace: Namespace
    toolset_id: ToolsetId
    credentials: Credentials


class RunCredentialsSetRequest(WireModel):
    run_id: RunId
    credentials: Credentials


class CredentialsSetReply(WireModel):
    level: CredentialLevel


class CredentialsExpiredData(WireModel):
    toolset_id: str
    namespace: str | None
    run_id: str | None
    server: str
    level: CredentialLevel
    call_ids: list[str]
    authorization_url: str | None = None
    """For a server connected through OAuth whose tokens could not be renewed: the URL to send the
    end user to; connecting there resumes the calls (absent for header credentials)."""
    connection_id: str | None = None

    def wire(self) -> dict[str, object]:
        # namespace and runId are part of the event even when null; the OAuth fields only when set.
        out = self.model_dump(mode="json", by_alias=True)
        for key in ("authorizationUrl", "connectionId"):
            if out.get(key) is None:
                out.pop(key, None)
        return out


class CredentialsExpired(WireModel):
    """The `credentials.expired` event and webhook body."""

    type: Literal["credentials.expired"] = "credentials.expired"
    data: CredentialsExpiredData

    def wire(self) -> dict[str, object]:
        return {"type": self.type, "data": self.data.wire()}


# ---- OAuth connections (credentials.connect / status / disconnect) ------------------------------

OAuthGrant = Literal["authorizationCode", "clientCredentials"]


class OAuthClient(WireModel):
    """A client registered with the server's authorization server by hand: given once, stored
    encrypted; the secret is never echoed."""

    client_id: str = Field(min_length=1, max_length=1024)
    client_secret: SecretStr | None = None

    @field_serializer("client_secret", when_used="always")
    def _plain(self, secret: SecretStr | None) -> str | None:
        return None if secret is None else secret.get_secret_value()


class CredentialsTarget(WireModel):
    """A level and scope: `runId` alone (run), `namespace` + `toolsetId` (namespace), or
    `toolsetId` alone (toolset)."""

    toolset_id: ToolsetId | None = None
    namespace: Namespace | None = None
    run_id: RunId | None = None


class CredentialsConnectRequest(CredentialsTarget):
    server: str = Field(min_length=1, max_length=256)
    scopes: list[Annotated[str, Field(min_length=1, max_length=256)]] | None = Field(
        default=None, max_length=64
    )
    max_scopes: list[Annotated[str, Field(min_length=1, max_length=256)]] | None = Field(
        default=None, max_length=64
    )
    """clientCredentials only: scopes a server's `insufficient_scope` challenge may widen the token
    to besides `scopes` (none by default); a challenge for any other scope parks the call."""
    client: OAuthClient | None = None
    grant: OAuthGrant = "authorizationCode"


class CredentialsConnectReply(WireModel):
    connection_id: str
    level: CredentialLevel
    status: Literal["pending", "connected"]
    authorization_url: str | None = None
    """The URL to send the end user to (authorization code): a single-use toolbus link
    (`/oauth/start/<token>`) that makes the `state` and PKCE verifier when opened and redirects to
    the authorization server; None when already connected."""
    expires_at: str | None = None
    """When the link stops being accepted (RFC 3339)."""


class CredentialsStatusRequest(CredentialsTarget):
    pass


class OAuthConnectionStatus(WireModel):
    server: str
    status: Literal["connected", "expired"]
    grant: OAuthGrant
    scopes: list[str]
    expires_at: str | None = None
    connected_at: str
    last_refresh_at: str | None = None
    """Null fields are left out on the wire."""
    issuer: str


class CredentialsStatusReply(WireModel):
    level: CredentialLevel
    connections: list[OAuthConnectionStatus]


class CredentialsDisconnectRequest(CredentialsTarget):
    server: str = Field(min_length=1, max_length=256)


class CredentialsDisconnectReply(WireModel):
    level: CredentialLevel
    server: str
    disconnected: bool
    revoked: bool
    """The refresh (or access) token was revoked at the authorization server (RFC 7009)."""


class CredentialsConnectionData(WireModel):
    """Null fields are left out on the wire (a `credentials.failed` for an unknown state knows
    none of the connection's)."""

    connection_id: str | None = None
    level: CredentialLevel | None = None
    toolset_id: str | None = None
    namespace: str | None = None
    run_id: str | None = None
    server: str | None = None
    scopes: list[str] = Field(default_factory=list)
    expires_at: str | None = None
    error: str | None = None
    """`credentials.failed` only: `access_denied` (the user refused), `unknownState`, `issuerMismatch`,
    `exchangeFailed`, `providerUnavailable`, or the provider's own error code."""
    message: str | None = None


class CredentialsConnected(WireModel):
    """`‹p›.events.credentials.connected`: an OAuth connection was made; tokens stored."""

    type: Literal["credentials.connected"] = "credentials.connected"
    data: CredentialsConnectionData


class CredentialsConnectFailed(WireModel):
    """`‹p›.events.credentials.failed`: a connection attempt ended without tokens; nothing stored."""

    type: Literal["credentials.failed"] = "credentials.failed"
    data: CredentialsConnectionData
