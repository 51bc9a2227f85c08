"""Registration's `credentials` go to the credentials service, as `toolsets.credentials.set` would:
one path stores, encrypts and resumes parked calls, whoever sets toolset-level credentials."""

from __future__ import annotations

import logging

import orjson
from nats.aio.client import Client as NatsClient
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from toolbus_contracts import Credentials, Subjects, ToolbusError
from toolbus_contracts.errors import Unavailable

log = logging.getLogger("toolbus.registry")


class CredentialsServiceSink:
    def __init__(self, nc: NatsClient, subjects: Subjects, timeout: float = 10.0) -> None:
        self._nc = nc
        self._subject = subjects.toolsets_credentials_set
        self._timeout = timeout

    async def set_toolset(self, toolset_id: str, credentials: Credentials) -> None:
        body = orjson.dumps({"toolsetId": toolset_id, "credentials": credentials.model_dump(mode="json")})
        try:
            msg = await self._nc.request(self._subject, body, timeout=self._timeout)
        except (NoRespondersError, NatsTimeout) as exc:
            # Not a bug: a service that did not answer. Registering again is safe (same id) and
            # stores them, so the reply is the retryable `unavailable`; with no credentials service
            # subscribed at all it says so (`noService`), and the SDK stops sending it again soon.
            none = isinstance(exc, NoRespondersError)
            log.warning(
                "registration's credentials not stored: the credentials service did not answer",
                extra={"toolsetId": toolset_id, "noService": none},
            )
            details: dict[str, object] = {"toolsetId": toolset_id, "service": "credentials"}
            if none:
                details["noService"] = True
            raise Unavailable(
                "The toolset was registered but its credentials were not stored: the credentials "
                "service did not answer; register again once it runs.",
                details=details,
            ) from None
        reply = orjson.loads(msg.data)
        if not reply.get("ok"):
            raise ToolbusError.from_wire(reply.get("error") or {})
