"""The request core every part of the SDK is built on: one NATS connection, request/reply with its
retries, and the mapping of replies and transport failures to `ToolbusError`s."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any, TypeVar

import nats
import orjson
from nats.aio.client import Client as NatsClient
from nats.errors import MaxPayloadError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError
from toolbus_contracts import Subjects, check_prefix
from toolbus_contracts.base import unfit_number, unfit_number_error, validation_to_error
from toolbus_contracts.errors import request_too_large as too_large

from toolbus._connection import ConnectOptions
from toolbus._errors import (
    Internal,
    InvalidRequest,
    Timeout,
    ToolbusError,
    Unavailable,
    client_closed,
    closed_as_unavailable,
    error_from_wire,
)
from toolbus._retry import Backoff, until_deadline

M = TypeVar("M", bound=BaseModel)
log = logging.getLogger("toolbus")

DEFAULT_TIMEOUT = 30.0
"""Seconds a request waits for its reply unless told otherwise (registration lists MCP servers)."""

DEFAULT_BACKOFF = Backoff()
"""The waits between retries after `unavailable`: 0.1 s doubling to 2 s, jittered."""


def stream_name(prefix: str, name: str) -> str:
    """The JetStream stream / bucket name the services derive from a subject prefix."""
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', prefix)}_{name}"


def build(model: type[M], **fields: Any) -> M:
    """A contract request body, checked before it is sent: a bad field is `InvalidRequest` naming it,
    as the service would answer."""
    # By wire name, so that an error names the field as the service would (`runId`, not `run_id`).
    names = model.model_fields
    wire = {(names[k].alias or k) if k in names else k: v for k, v in fields.items() if v is not None}
    try:
        built = model.model_validate(wire)
    except ValidationError as exc:
        raise validation_to_error(exc) from None
    for name, value in wire.items():
        if isinstance(value, dict | list | tuple | set | frozenset | float):  # NaN, infinity: null otherwise
            # integers beyond 64 bits: refused by the service in a call's input, kept as the
            # nearest double elsewhere (a pinned schema's)
            unfit = unfit_number(value, (name,), ints=name == "input")
            if unfit is not None:
                raise unfit_number_error(unfit)
    return built


async def _quiet(exc: Exception) -> None:
    """nats-py's default error callback logs every failed attempt at ERROR; say it once, lower."""
    log.debug("NATS connection: %s: %s", type(exc).__name__, exc)


async def open_nats(opts: ConnectOptions) -> NatsClient:
    """A connected nats-py client, or `Unavailable` (not retryable when NATS refused the
    credentials). nats-py retries a failed first connect max_reconnect_attempts times,
    reconnect_time_wait apart (2 minutes by default): try each server twice instead, then, once
    connected, reconnect for as long as it takes."""
    seen: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        seen.append(exc)
        await _quiet(exc)

    kwargs = {"error_cb": on_error, **opts.nats_kwargs()}
    try:
        nc = await nats.connect(**kwargs, max_reconnect_attempts=1, reconnect_time_wait=0.2)
    except (OSError, NatsTimeout, TimeoutError, nats.errors.Error) as exc:
        # nats-py reports the server's -ERR as a plain `Error("nats: 'Authorization Violation'")`.
        if any(
            isinstance(e, nats.errors.AuthorizationError) or "authorization violation" in str(e).lower()
            for e in [exc, *seen]
        ):
            raise Unavailable(
                f"NATS at {opts.nats_url} refused the connection's credentials (authorization "
                "violation): check the TOOLBUS_NATS_* settings.",
                details={"natsUrl": opts.nats_url},
                retryable=False,
            ) from None
        raise Unavailable(
            f"Could not connect to NATS at {opts.nats_url}: {type(exc).__name__}. Is the stack "
            "running (`toolbus up` or `make up`)?",
            details={"natsUrl": opts.nats_url},
        ) from None
    nc.options["max_reconnect_attempts"] = -1
    nc.options["reconnect_time_wait"] = 2
    return nc


NO_SERVICE_WAIT = 5.0
"""Seconds a request with no service subscribed at all is sent again (a service restarting is
back within them); after that its `Unavailable` is raised, so a stack that is not running is
told in seconds, not after the whole request timeout. A backing store that is down (the service
answers `unavailable`) is waited out until the timeout."""


def _no_service_for_long(exc: Unavailable, spent: float) -> bool:
    return bool(exc.details.get("noService")) and spent >= NO_SERVICE_WAIT


class Core:
    """One connection to a toolbus deployment (a NATS client and a subject prefix) and its
    request/reply: what every part of the SDK (toolsets, runs, approvals, feeds, the worker) is
    given. `Toolbus` is this core with the parts on it."""

    def __init__(
        self,
        nc: NatsClient,
        prefix: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        owns_connection: bool = True,
        retry_unavailable: bool = True,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        self.nc = nc
        self.prefix = check_prefix(prefix)  # ValueError for one no subject can be built under
        self.subjects = Subjects(prefix)
        self.timeout = timeout
        self.retry_unavailable = retry_unavailable
        self.backoff = backoff
        self._owns = owns_connection

    async def close(self) -> None:
        """Drain and close the connection (when this object opened it)."""
        if self._owns and not self.nc.is_closed:
            await self.nc.drain()

    @property
    def js(self) -> JetStreamContext:
        return self.nc.jetstream()

    def stream(self, name: str) -> str:
        """A JetStream stream or bucket name of this deployment (`EVENTS`, `outputs`, ...)."""
        return stream_name(self.prefix, name)

    async def request(
        self,
        subject: str,
        body: BaseModel | dict[str, Any],
        *,
        timeout: float | None = None,
        retry: bool = False,
        settle: Callable[[ToolbusError], Any] | None = None,
    ) -> Any:
        """Send one request and return the reply's `data`; an `ok: false` reply raises its exception.

        No service subscribed: `Unavailable`. No reply within `timeout` seconds: `Timeout`.
        `retry=True` (only for a request that is safe to send again) sends it again after a
        retryable `Unavailable` while `retry_unavailable` is on, until `timeout` is spent.
        `settle(exc)`, for an error answered to a retry (after an `unavailable`), may return the
        `data` it stands for (a first attempt applied whose reply was lost), or None to raise it.
        """
        try:
            payload = (
                body.model_dump_json(exclude_none=True).encode()
                if isinstance(body, BaseModel)
                else orjson.dumps(body)
            )
        except (PydanticSerializationError, TypeError) as exc:  # a value JSON has no form for
            raise InvalidRequest(
                f"The request cannot be written as JSON: {str(exc)[:200]}.", details={"field": "body"}
            ) from None

        async def send(left: float, retried: bool) -> Any:
            try:
                return await self._send(subject, payload, left)
            except ToolbusError as exc:
                if retried and settle is not None and not isinstance(exc, Unavailable):
                    data = settle(exc)
                    if data is not None:
                        return data
                raise

        wait = self.timeout if timeout is None else timeout
        backoff = self.backoff if retry and self.retry_unavailable else None
        return await until_deadline(send, wait, backoff, give_up=_no_service_for_long)

    async def _send(self, subject: str, payload: bytes, wait: float) -> Any:
        """One request and its reply's `data` (see `request`)."""
        if len(payload) > self.nc.max_payload > 0:  # nothing is sent: it would fail in nats-py
            raise too_large(subject, len(payload), self.nc.max_payload)
        try:
            with closed_as_unavailable(subject):
                msg = await self.nc.request(subject, payload, timeout=wait)
        except MaxPayloadError:  # the size checked in `request`, plus the headers nats-py adds
            raise too_large(subject, len(payload), self.nc.max_payload) from None
        except NoRespondersError:
            raise Unavailable(
                f"No toolbus service answers on {subject}: is the stack running (`toolbus up`)?",
                details={"subject": subject, "noService": True},
            ) from None
        except (NatsTimeout, TimeoutError):
            if self.nc.is_closed:  # closed while it waited: nats-py's drain drops the reply
                raise client_closed(subject) from None
            raise Timeout(f"No reply on {subject} within {wait:g}s.", details={"subject": subject}) from None
        try:
            reply = orjson.loads(msg.data)
        except orjson.JSONDecodeError:
            raise Internal(f"The reply on {subject} is not JSON.") from None
        if not isinstance(reply, dict) or "ok" not in reply:
            raise Internal(f"The reply on {subject} is not a toolbus envelope.")
        if reply["ok"] is not True:
            raise error_from_wire(reply.get("error"))
        return reply.get("data")
