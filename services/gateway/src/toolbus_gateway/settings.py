"""Settings only the gateway reads (`TOOLBUS_GATEWAY_*`; the shared ones are `toolbus_common.Settings`)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class GatewaySettings(BaseSettings):
    """Where the MCP endpoint listens, how runs are bound and closed, and who may connect."""

    model_config = SettingsConfigDict(env_prefix="TOOLBUS_GATEWAY_", extra="ignore", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8787, ge=0, le=65535)
    """The MCP endpoint's port (`/mcp/<toolsetId>`); 0: one the OS picks (tests)."""
    public_url: str | None = None
    """The URL clients reach the gateway at (behind a proxy); default `http://host:port`. The
    protected-resource metadata names resources under it."""
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    """The largest request body taken; a larger one is answered 413 without being read."""
    page_size: int = Field(default=100, ge=1, le=10_000)
    """Tools per `tools/list` page."""
    large_toolset: int = Field(default=200, ge=1)
    """A toolset with more tools than this is offered as `search_tools`, `list_tools` and
    `call_tool` (a client may ask for either with `?tools=all` or `?tools=search`)."""
    run_idle_seconds: float = Field(default=900.0, gt=0)
    """A run the gateway opened is closed after this long without a call."""
    call_timeout_seconds: float = Field(default=3600.0, gt=0)
    """The longest a `tools/call` waits for its outcome (the call itself goes on)."""
    watch_interval_seconds: float = Field(default=1.0, gt=0)
    """How often a call still in flight is looked at (`calls.get`): progress notifications while
    it waits for approval, and an answer at once when it is parked on expired credentials."""
    reconnect_url: str | None = None
    """Where an end user renews expired credentials, shown in the tool error of a parked call;
    `{server}` (the tool's MCP server), `{namespace}` and `{toolsetId}` are filled in."""
    token_cache_seconds: float = Field(default=1.0, ge=0)
    """How long a checked token is taken without asking Redis again (0: every request asks). A
    token revoked here is refused at once; revoked through another replica, within this time."""
    jwt_jwks_url: str | None = None
    """The identity provider's JWKS: set it (with issuer and audience) to accept its JWTs."""
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_namespace_claim: str = "sub"
    """The claim whose value is the namespace (end user) of a JWT's calls."""
    jwt_toolsets_claim: str = "toolbus_toolsets"
    """The claim listing the toolset ids a JWT may reach (a list, or a space-separated string)."""
    jwt_algorithms: str = "RS256,ES256,EdDSA"
    authorization_servers: str | None = None
    """Comma-separated authorization servers for the protected-resource metadata (default: the
    JWT issuer)."""

    @property
    def base_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")
