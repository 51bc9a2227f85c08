"""Runs and calls: open a run, call its tools (waiting, or with a handle), follow its events, set
run-level credentials, close it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Generator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import orjson
from toolbus_contracts import (
    CallEvent,
    CallGetReply,
    CallGetRequest,
    CallInvokeReply,
    CallStartReply,
    CallStartRequest,
    CallState,
    CredentialsSetReply,
    RunCloseReply,
    RunCloseRequest,
    RunCredentialsSetRequest,
    RunOpenReply,
    RunOpenRequest,
)

from toolbus._connections import Connection, Connections
from toolbus._core import Core, build
from toolbus._errors import InvalidRequest, Timeout, closed_as_unavailable
from toolbus._feeds import CLOSED_CHECK_EVERY
from toolbus._outcomes import CallResult, resolve
from toolbus._stored import call_events
from toolbus._toolsets import CredentialsLike, Toolset, Toolsets, credentials_body, toolset_id

POLL_EVERY = 2.0
"""Seconds a handle waits for the `completed` event before it asks `calls.get` as well."""


@dataclass(frozen=True)
class CallStatus:
    """`calls.get`: where a call is (`queued` ... `done`), its attempts so far, its result once done."""

    call_id: str
    state: CallState
    attempts: int
    result: CallResult | None


class Runs:
    """`‹p›.runs.open`: a run of one toolset, for one end user (`namespace`)."""

    def __init__(self, tb: Core) -> None:
        self._tb = tb

    async def open(
        self, toolset: Toolset | str, *, namespace: str | None = None, run_id: str | None = None
    ) -> Run:
        """Open a run (opening an open run again with the same toolset is a no-op). Without
        `run_id` the SDK picks one (`run_<32 hex>`, the service's own form), so a retry after
        `unavailable` opens the same run, never a second one."""
        run_id = run_id or f"run_{uuid.uuid4().hex}"
        body = build(RunOpenRequest, toolset_id=toolset_id(toolset), namespace=namespace, run_id=run_id)
        reply = RunOpenReply.model_validate(
            await self._tb.request(self._tb.subjects.runs_open, body, retry=True)
        )
        return Run(self._tb, reply.run_id, toolset_id(toolset), namespace)

    def attach(self, run_id: str) -> Run:
        """A handle on a run opened elsewhere (no request is sent). A string that is no run id
        (it becomes a subject token: `*`, `>`, a space) is `InvalidRequest` naming `runId`."""
        build(RunCloseRequest, run_id=run_id)  # the run id's check, as the dispatcher makes it
        return Run(self._tb, run_id, None, None)

    async def call_status(self, call_id: str) -> CallStatus:
        """`calls.get` of any call by id. Unknown id: `NotFound`."""
        return await call_status(self._tb, call_id)


async def call_status(tb: Core, call_id: str) -> CallStatus:
    """`calls.get` of any call by id, its outcome resolved. Unknown id: `NotFound`."""
    data = await tb.request(tb.subjects.calls_get, build(CallGetRequest, call_id=call_id), retry=True)
    reply = CallGetReply.model_validate(data)
    result = None
    if reply.outcome is not None:
        result = await resolve(tb.js, reply.outcome, call_id=reply.call_id, idempotency_key=None)
    return CallStatus(reply.call_id, reply.state, reply.attempts, result)


class Run:
    """One open run. `async with` closes it at the end."""

    def __init__(self, tb: Core, run_id: str, toolset_id: str | None, namespace: str | None) -> None:
        self._tb = tb
        self.id = run_id
        self.toolset_id = toolset_id
        self.namespace = namespace

    def __repr__(self) -> str:
        return f"Run({self.id!r})"

    @property
    def toolsets(self) -> Toolsets:
        """The toolsets calls on this run's connection (its toolset's catalogue, search, tools)."""
        return Toolsets(self._tb)

    async def __aenter__(self) -> Run:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _body(
        self, tool: str, input: Mapping[str, Any] | None, idempotency_key: str | None
    ) -> CallStartRequest:
        """The `calls.start`/`calls.invoke` body; without `idempotency_key` one is made for this
        logical call (32 hex digits, the service's own form) and sent on every retry of it, so a
        retry after `unavailable` finds the stored call instead of creating a second one."""
        if input is not None and not isinstance(input, Mapping):
            raise InvalidRequest(
                f"Field 'input' must be a mapping (a JSON object), not {type(input).__name__}.",
                details={"field": "input"},
            )
        return build(  # NaN, infinity, 2**70 in the input: refused, naming where, as the service would
            CallStartRequest,
            run_id=self.id,
            tool=tool,
            input=dict(input or {}),
            idempotency_key=idempotency_key or uuid.uuid4().hex,
        )

    async def invoke(
        self,
        tool: str,
        input: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        timeout: float | None = None,
    ) -> CallResult:
        """Run one call to the end and return its `CallResult` (an error outcome does not raise;
        a refused request, `UnknownTool` or `InvalidInput`, does). `timeout` (seconds, default the
        connection's) bounds the wait, not the call: on `Timeout` the call goes on, and the same
        `idempotency_key` finds it again."""
        body = self._body(tool, input, idempotency_key)
        try:
            data = await self._tb.request(self._tb.subjects.calls_invoke, body, timeout=timeout, retry=True)
        except Timeout as exc:  # the call goes on: say which key finds it again
            exc.details = {**exc.details, "idempotencyKey": body.idempotency_key}
            raise
        reply = CallInvokeReply.model_validate(data)
        return await resolve(
            self._tb.js, reply.outcome, call_id=reply.call_id, idempotency_key=reply.idempotency_key
        )

    async def call(
        self,
        tool: str,
        input: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Run one call and return its output; an error outcome raises its exception (`ToolError`,
        `Denied`, `OutcomeUnknown`, ...) with the `callId` in `details`."""
        result = await self.invoke(tool, input, idempotency_key=idempotency_key, timeout=timeout)
        return result.unwrap()

    async def start(
        self, tool: str, input: Mapping[str, Any] | None = None, *, idempotency_key: str | None = None
    ) -> CallHandle:
        """Start a call once it is stored durably; the handle awaits, polls or follows it."""
        data = await self._tb.request(
            self._tb.subjects.calls_start, self._body(tool, input, idempotency_key), retry=True
        )
        reply = CallStartReply.model_validate(data)
        return CallHandle(self._tb, self.id, reply.call_id, reply.idempotency_key)

    def events(self, *, follow: bool = True) -> AsyncIterator[CallEvent]:
        """The run's call events from its first one, in order (a replay from the JetStream stream);
        with `follow=False` the iterator ends once it has caught up, else it waits for more."""
        return _events(self._tb, self._tb.subjects.run_events(self.id), follow=follow)

    async def connect(self, server: str, *, scopes: list[str] | None = None) -> Connection:
        """An OAuth connection for this run only (the most specific level)."""
        return await Connections(self._tb).connect(server, run_id=self.id, scopes=scopes)

    async def set_credentials(self, credentials: CredentialsLike) -> str:
        """Replace this run's credentials (the most specific level); parked calls are sent again."""
        body = build(RunCredentialsSetRequest, run_id=self.id, credentials=credentials_body(credentials))
        data = await self._tb.request(self._tb.subjects.runs_credentials_set, body, retry=True)
        return CredentialsSetReply.model_validate(data).level

    async def close(self) -> int:
        """End the run: unfinished calls end `cancelled` (their number is returned), run-level
        credentials are deleted."""
        data = await self._tb.request(
            self._tb.subjects.runs_close, build(RunCloseRequest, run_id=self.id), retry=True
        )
        return RunCloseReply.model_validate(data).cancelled


class CallHandle:
    """A started call: `await handle` gives its output (or raises), `await handle.wait()` its
    `CallResult`, `await handle.status()` where it is now, `handle.events()` its events.

    The contract has no call-level cancel: `run.close()` ends every unfinished call of a run, and
    cancelling a task that awaits a handle stops only the waiting.
    """

    def __init__(self, tb: Core, run_id: str, call_id: str, idempotency_key: str) -> None:
        self._tb = tb
        self.run_id = run_id
        self.call_id = call_id
        self.idempotency_key = idempotency_key

    def __repr__(self) -> str:
        return f"CallHandle({self.call_id!r})"

    async def status(self) -> CallStatus:
        return await call_status(self._tb, self.call_id)

    def events(self, *, follow: bool = True) -> AsyncIterator[CallEvent]:
        return _events(self._tb, self._tb.subjects.call_events(self.run_id, self.call_id), follow=follow)

    async def wait(self, timeout: float | None = None) -> CallResult:
        """Wait until the call is done: its `completed` event, checked against `calls.get` every
        `POLL_EVERY` seconds so that a missed event cannot hang the wait. `timeout`: `Timeout`."""
        try:
            async with asyncio.timeout(timeout):
                return await self._wait()
        except TimeoutError:
            waited = f"within {timeout:g}s" if timeout is not None else "before NATS stopped answering"
            raise Timeout(
                f"Call {self.call_id} was not done {waited} (it goes on).", details={"callId": self.call_id}
            ) from None

    async def _wait(self) -> CallResult:
        tb = self._tb
        subject = tb.subjects.call_events(self.run_id, self.call_id)
        with closed_as_unavailable(subject):  # at the subscription, each event and each status()
            events = call_events(tb.nc, tb.js, tb.stream("EVENTS"), subject, follow=True, idle=POLL_EVERY)
            try:
                async for stored in events:
                    if not stored.data:  # POLL_EVERY without an event
                        status = await self.status()
                        if status.result is not None:
                            return status.result
                        continue
                    event = orjson.loads(stored.data)
                    if event.get("type") == "completed" and isinstance(event.get("outcome"), dict):
                        return await resolve(
                            tb.js,
                            event["outcome"],
                            call_id=self.call_id,
                            idempotency_key=self.idempotency_key,
                        )
            finally:
                await events.aclose()
        raise AssertionError("a followed event feed never ends")  # pragma: no cover

    async def result(self, timeout: float | None = None) -> Any:
        """The output, or raise the call's error."""
        return (await self.wait(timeout)).unwrap()

    def __await__(self) -> Generator[Any, None, Any]:
        return self.result().__await__()


async def _events(tb: Core, subject: str, *, follow: bool) -> AsyncIterator[CallEvent]:
    with closed_as_unavailable(subject):  # at the subscription and at each next event
        # Never longer between looks either way: nats-py wakes no waiting next_msg when the client
        # is drained, but the next look after it raises ConnectionClosedError (Unavailable).
        events = call_events(
            tb.nc, tb.js, tb.stream("EVENTS"), subject, follow=follow, idle=CLOSED_CHECK_EVERY
        )
        try:
            async for stored in events:
                if stored.data:
                    yield CallEvent.model_validate(orjson.loads(stored.data))
        finally:
            await events.aclose()
