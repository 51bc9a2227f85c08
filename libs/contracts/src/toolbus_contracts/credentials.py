"""Credential bodies: headers per MCP server. Header values are secrets and never printed."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, SecretStr, field_serializer

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
    if not _TOKEN.fullmatch(name):
        raise ValueError(f"header name '{name[:40]}' is not an HTTP token")
    if name.lower() in _FORBIDDEN_NAMES:
        raise ValueError(f"header '{name}' is set by toolbus and cannot be given as a credential")
    return name


def _check_header_value(value: SecretStr) -> SecretStr:
    raw = value.get_secret_value()
    if raw == "" or raw != raw.strip():
        raise ValueError("a header value must be non-empty with no leading or trailing space")
    if any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in raw):
        raise ValueError("a header value must not contain control characters")
    try:
        raw.encode("latin-1")
    except UnicodeEncodeError:
        raise ValueError("a header value must be Latin-1 text") from None
    return value


HeaderName = Annotated[str, AfterValidator(_check_header_name)]
HeaderValue = Annotated[SecretStr, AfterValidator(_check_header_value)]


class ServerCredentials(WireModel):
    headers: dict[HeaderName, HeaderValue] = Field(min_length=1)

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

    def wire(self) -> dict[str, object]:
        # namespace and runId are part of the event even when null.
        return self.model_dump(mode="json")


class CredentialsExpired(WireModel):
    """The `credentials.expired` event and webhook body."""

    type: Literal["credentials.expired"] = "credentials.expired"
    data: CredentialsExpiredData

    def wire(self) -> dict[str, object]:
        return {"type": self.type, "data": self.data.wire()}
