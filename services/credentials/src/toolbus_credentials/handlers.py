"""The credentials service's subjects: parse, call `CredentialsLogic`, reply (or ack)."""

from __future__ import annotations

from toolbus_common.bus import Routes
from toolbus_contracts.credentials import (
    CredentialsConnected,
    CredentialsConnectFailed,
    CredentialsConnectReply,
    CredentialsConnectRequest,
    CredentialsDisconnectReply,
    CredentialsDisconnectRequest,
    CredentialsExpired,
    CredentialsSetReply,
    CredentialsStatusReply,
    CredentialsStatusRequest,
    NamespaceCredentialsSetRequest,
    RunCredentialsSetRequest,
    ToolsetCredentialsSetRequest,
)
from toolbus_contracts.errors import Unavailable
from toolbus_contracts.internal import CallParked, CallsResume, CredentialsChanged, RunClosed

from toolbus_credentials.oauth import OAuthConnections
from toolbus_credentials.service import CredentialsLogic

DURABLE_PARK = "credentials_park"
DURABLE_RUNS_CLOSED = "credentials_runs_closed"

routes: Routes[CredentialsLogic] = Routes("credentials")


@routes.request(lambda s: s.toolsets_credentials_set)
async def handle_toolsets_credentials_set(
    logic: CredentialsLogic, request: ToolsetCredentialsSetRequest
) -> CredentialsSetReply:
    """Replace a toolset's credentials; resumes the calls parked at that level."""
    return await logic.set_toolset(request)


@routes.request(lambda s: s.namespaces_credentials_set)
async def handle_namespaces_credentials_set(
    logic: CredentialsLogic, request: NamespaceCredentialsSetRequest
) -> CredentialsSetReply:
    """Replace an end user's (namespace's) credentials for a toolset; resumes the calls parked there."""
    return await logic.set_namespace(request)


@routes.request(lambda s: s.runs_credentials_set)
async def handle_runs_credentials_set(
    logic: CredentialsLogic, request: RunCredentialsSetRequest
) -> CredentialsSetReply:
    """Replace a run's credentials; resumes the calls parked there."""
    return await logic.set_run(request)


def _oauth(logic: CredentialsLogic) -> OAuthConnections:
    if logic.oauth is None:
        raise Unavailable("OAuth connections are not enabled on this credentials service.")
    return logic.oauth


@routes.request(lambda s: s.credentials_connect)
async def handle_credentials_connect(
    logic: CredentialsLogic, request: CredentialsConnectRequest
) -> CredentialsConnectReply:
    """Start an OAuth connection for a server at a level: the authorization URL to send the end
    user to (authorization code), or connected at once (client credentials, toolset level)."""
    return await _oauth(logic).connect(request)


@routes.request(lambda s: s.credentials_status)
async def handle_credentials_status(
    logic: CredentialsLogic, request: CredentialsStatusRequest
) -> CredentialsStatusReply:
    """The OAuth connections at a level: servers, until when, scopes, last refresh."""
    return await _oauth(logic).status(request)


@routes.request(lambda s: s.credentials_disconnect)
async def handle_credentials_disconnect(
    logic: CredentialsLogic, request: CredentialsDisconnectRequest
) -> CredentialsDisconnectReply:
    """Remove a server's OAuth connection at a level, revoking its token where offered (RFC 7009)."""
    return await _oauth(logic).disconnect(request)


@routes.command(lambda s: s.internal_calls_park, durable=DURABLE_PARK)
async def handle_call_parked(logic: CredentialsLogic, parked: CallParked) -> None:
    """dispatcher → credentials: a call met a 401 and waits for new credentials."""
    await logic.park(parked)


@routes.command(lambda s: s.internal_runs_closed, durable=DURABLE_RUNS_CLOSED)
async def handle_run_closed(logic: CredentialsLogic, closed: RunClosed) -> None:
    """dispatcher → credentials: the run ended; drop its parked calls."""
    await logic.run_closed(closed)


routes.event(
    lambda s: s.credentials_expired,
    CredentialsExpired,
    "A server rejected a call's credentials (401): the call is parked until new ones are set at that "
    "level and scope. The same JSON is sent as the webhook.",
)
routes.event(
    lambda s: s.internal_calls_resume,
    CallsResume,
    "credentials → dispatcher: parked calls to send again, in order (JetStream, INTERNAL stream).",
)
routes.event(
    lambda s: s.internal_credentials_changed,
    CredentialsChanged,
    "credentials → every dispatcher: cached credentials of one scope are stale (plain NATS).",
)
routes.event(
    lambda s: s.credentials_connected,
    CredentialsConnected,
    "An OAuth connection was made (the end user consented, or client credentials): tokens stored "
    "encrypted at the level; calls parked there for the server are sent again.",
)
routes.event(
    lambda s: s.credentials_failed,
    CredentialsConnectFailed,
    "An OAuth connection attempt ended without tokens (refused consent, unknown or used state, "
    "wrong issuer, provider down): nothing stored.",
)
