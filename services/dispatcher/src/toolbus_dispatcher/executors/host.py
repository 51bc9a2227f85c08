"""Host tools: each attempt is a `HostCallTask` for the workers of the queue group
`toolbus-workers`; the worker heartbeats on `host.heartbeat.<callId>.<token>` and answers on the
task's reply subject, `host.result.<callId>.<token>`.

One wildcard subscription per process for heartbeats and one for results route messages to the
attempt waiting here; a message for an attempt that is not current is dropped. A heartbeat missing
for `heartbeatTimeout` interrupts the attempt.

The task is published with reply subject `host.result.<callId>.<token>`, a token of its own for
each attempt: the worker's result is its reply. That is what lets the NATS `worker` user
(deploy/nats/) answer only the calls it was sent, once each (`allow_responses`, no publish
permission on `host.result.>`). It also keeps "no responders" known at once: with no worker
subscribed the server sends a status 503 to the reply subject, on this connection's own
`host.result.>` subscription only (`subForReply` in nats-server), and the attempt was never sent.

The token is what tells the worker's answer from anyone else's. Any user can have a service's or
JetStream's answer published on any subject by naming it as a request's reply subject, and call ids
are in the events every harness reads, but only the worker the task went to learns the token. So
what arrives on the token subject is the worker's: a result that is not one ends the attempt
`upstreamError`, a 503 means it was never sent. On the bare `host.result.<callId>` of the contract
(a worker that publishes there itself, on a NATS without the permissions) only a well-formed result
of the running attempt counts; anything else there is dropped. A stored message can be one (a
call's own `attemptStarted` event): the bus's listener drops every stored message JetStream hands
out before it reaches `on_result` (`consumer_delivery`), so subscribe these handlers through the
bus. A late answer of an earlier attempt, on that attempt's token, is dropped too. Heartbeats the
same way: on `host.heartbeat.<callId>.<token>` an empty body or the running attempt, on the bare
`host.heartbeat.<callId>` only the running attempt (JetStream answers an ack sent with a reply
subject with an empty, header-less message).

An attempt given up here without its result (the run was closed, the call moved to another
replica, its heartbeats stopped, its timeout passed, the dispatcher stops) is announced on
`host.cancel.<token>`, so that its worker stops running a call whose result would be
dropped; a worker that does not listen there runs it to the end, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from toolbus_common.logging import Every
from toolbus_contracts import Subjects, duration_seconds
from toolbus_contracts.errors import Timeout, ToolError, UpstreamError, UpstreamUnreachable

from toolbus_dispatcher.executors.base import Attempt, Interrupted

log = logging.getLogger(__name__)

NO_RESPONDERS = "503"
"""The status nats-server puts in the header of the message it sends to the reply subject of a
publish that reached no subscriber."""


BARE_LOG_EVERY = 60.0
"""Seconds between warnings of messages on the bare result subject that are not results."""


@dataclass(frozen=True, slots=True)
class _Malformed:
    """A result the worker sent that is not one: what is wrong with it."""

    problem: str


@dataclass(slots=True)
class _Waiter:
    attempt: int
    token: str
    """This attempt's part of its reply subject: `host.result.<callId>.<token>`."""
    result: asyncio.Future[dict[str, Any] | _Malformed | None]
    """The worker's result; None: no worker was subscribed (the task never left)."""
    last_beat: float = field(default_factory=time.monotonic)


class HostExecutor:
    """Runs attempts of host tools and routes worker heartbeats and results to them."""

    def __init__(self, nc: NatsClient, subjects: Subjects) -> None:
        self._nc = nc
        self._subjects = subjects
        self._waiters: dict[str, _Waiter] = {}
        self._result_at = len(subjects.host_result(""))
        self._beat_at = len(subjects.host_heartbeat(""))
        self._bare_logged = Every(BARE_LOG_EVERY)

    async def on_heartbeat(self, msg: Msg) -> None:
        call_id, _, token = msg.subject[self._beat_at :].partition(".")
        waiter = self._waiters.get(call_id)
        if waiter is None:
            return
        if msg.headers and "Status" in msg.headers:  # the server's, not a worker's
            return
        if token and token != waiter.token:
            return
        if msg.data or not token:
            # Only the running attempt's: any user can have JetStream's or a service's answers
            # sent here (a request's reply subject is not checked against its permissions), and
            # those never carry it; JetStream answers some with an empty body, so on the bare
            # subject an empty body is no heartbeat. On the attempt's token subject it is.
            try:
                body = orjson.loads(msg.data)
            except orjson.JSONDecodeError:
                return
            if not isinstance(body, dict) or body.get("attempt") != waiter.attempt:
                return
        waiter.last_beat = time.monotonic()

    async def on_result(self, msg: Msg) -> None:
        call_id, _, token = msg.subject[self._result_at :].partition(".")
        waiter = self._waiters.get(call_id)
        if waiter is None or waiter.result.done():
            return
        if token and token != waiter.token:  # an earlier attempt's, come late (or a guess)
            return
        ours = bool(token)  # on the reply subject only the worker the task went to knows
        if msg.headers and msg.headers.get("Status") == NO_RESPONDERS:
            if ours:
                waiter.result.set_result(None)
            return
        try:
            body = orjson.loads(msg.data)
        except orjson.JSONDecodeError:  # NaN and 1e400 too: JSON has no such numbers
            self._malformed(waiter, ours, "JSON", call_id)
            return
        attempt = body.get("attempt") if isinstance(body, dict) else None
        if type(attempt) is not int:
            self._malformed(waiter, ours, 'a JSON object with an integer "attempt"', call_id)
        elif attempt == waiter.attempt:
            waiter.result.set_result(body)
        elif ours:  # only this attempt's worker knows the token: its bug
            waiter.result.set_result(_Malformed(f"a result of the attempt it was sent ({waiter.attempt})"))
        # else: the result of an earlier attempt, come late: dropped

    def _malformed(self, waiter: _Waiter, ours: bool, expected: str, call_id: str) -> None:
        """A result that is not one: the worker's bug on its reply subject (ends the attempt);
        on the bare subject anyone's answer, dropped, said at most once a minute."""
        if ours:
            waiter.result.set_result(_Malformed(expected))
            return
        if self._bare_logged.due():
            log.warning(
                "dropped a message on a host call's bare result subject that is not a result "
                "(a worker should answer on the task's reply subject; only the first a minute is logged)",
                extra={"callId": call_id, "expected": expected},
            )

    async def _cancel(self, token: str, attempt: int) -> None:
        """Tell the worker of an attempt given up here to stop it (at most once, no answer)."""
        try:
            await self._nc.publish(self._subjects.host_cancel(token), b'{"attempt":%d}' % attempt)
        except Exception as exc:  # closed or draining: the worker's result is dropped all the same
            log.debug("could not announce a given-up host attempt", extra={"error": type(exc).__name__})

    async def execute(self, attempt: Attempt) -> Any:
        call = attempt.call
        hb = duration_seconds(attempt.tool.policy.heartbeat_timeout)
        task = {
            "callId": call.call_id,
            "attempt": attempt.number,
            "idempotencyKey": call.idempotency_key,
            "runId": call.run_id,
            "namespace": call.namespace,
            "toolsetId": call.toolset_id,
            "tool": attempt.tool.name,
            "input": attempt.input,
            "heartbeatTimeout": attempt.tool.policy.heartbeat_timeout,
        }
        if attempt.tool.policy.timeout is not None:  # left out when none: older workers forbid it
            task["timeout"] = attempt.tool.policy.timeout
        token = os.urandom(16).hex()
        waiter = _Waiter(attempt.number, token, asyncio.get_running_loop().create_future())
        self._waiters[call.call_id] = waiter
        answered = False
        try:
            await self._nc.publish(
                self._subjects.host_call(attempt.tool.name),
                orjson.dumps(task),
                reply=self._subjects.host_result(call.call_id, token),
            )
            while True:
                remaining = waiter.last_beat + hb - time.monotonic()
                if remaining <= 0:
                    raise Interrupted(
                        Timeout(
                            f"The worker of host tool '{attempt.tool.name}' missed its heartbeat "
                            f"for {attempt.tool.policy.heartbeat_timeout}."
                        )
                    )
                with contextlib.suppress(TimeoutError):
                    body = await asyncio.wait_for(asyncio.shield(waiter.result), remaining)
                    break
            answered = True
        finally:
            if self._waiters.get(call.call_id) is waiter:
                del self._waiters[call.call_id]
            if not answered:
                await self._cancel(token, attempt.number)
        if body is None:
            raise Interrupted(
                UpstreamUnreachable(f"No worker is subscribed for host tool '{attempt.tool.name}'."),
                sent=False,
            )
        if isinstance(body, _Malformed):  # the worker's bug: sending the call again would not mend it
            log.warning(
                "host worker answered a result that is not one",
                extra={"tool": attempt.tool.name, "callId": call.call_id, "expected": body.problem},
            )
            raise UpstreamError(
                f"The worker of host tool '{attempt.tool.name}' answered a result that is not "
                f"{body.problem}; see the host-tool protocol."
            )
        error = body.get("error")
        if isinstance(error, str):  # a bare message
            error = {"message": error}
        if error is not None:
            message = error.get("message") if isinstance(error, dict) else None
            raise ToolError(str(message or "the host tool reported an error")[:2000])
        return body.get("output")
