"""Settings of the approvals web console (`TOOLBUS_CONSOLE_*`); the console is off unless
`TOOLBUS_CONSOLE_PORT` is set."""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class ConsoleSettings(BaseSettings):
    """Where the console listens, its public URL, the OpenID Connect client it signs people in
    with, which groups see which approvals (`access.Grants`), and the development token."""

    model_config = SettingsConfigDict(env_prefix="TOOLBUS_CONSOLE_", extra="ignore", frozen=True)

    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=0, le=65535)
    """Unset: no console. 0: a free port (logged)."""
    url: str | None = None
    """The console's public URL (what a browser opens; the OIDC redirect URI is `<url>/auth/callback`);
    unset: `http://<host>:<port>`."""
    oidc_issuer: str | None = None
    oidc_client_id: str | None = None
    oidc_client_secret: SecretStr | None = None
    oidc_scopes: str = "openid profile email"
    groups_claim: str = "groups"
    """The ID token claim listing the person's groups (a list of strings, or one string)."""
    groups: dict[str, Any] = Field(default_factory=dict)
    """JSON: group -> `{"toolsets": [...], "namespaces": [...]}` (a missing list, or `"*"` in it,
    means any), or a list of such grants; see docs/console.md."""
    dev_token: SecretStr | None = None
    """A token that signs in as `dev` with access to everything (development only); unset: off."""

    @field_validator("groups", mode="before")
    @classmethod
    def _json(cls, value: Any) -> Any:
        if isinstance(value, str | bytes):
            return orjson.loads(value) if value.strip() else {}
        return value

    @property
    def enabled(self) -> bool:
        return self.port is not None
