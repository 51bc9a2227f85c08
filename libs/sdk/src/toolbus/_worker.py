"""The host-tool worker: serves `@host_tool` functions in the queue group `toolbus-workers`,
heartbeats while each runs, runs up to `concurrency` at once, and on SIGTERM stops taking calls and
finishes the ones it holds (handing back, by going silent, those still running after `grace`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Iterable
from types import TracebackType
from typing import Any

import orjson
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import MaxPayloadError
from pydantic import ValidationError
from toolbus_contracts import WORKER_QUEUE, HostCallTask, HostCancel, consumer_delivery, duration_seconds

from toolbus._connection import flush
from toolbus._core import Core
from toolbus._errors import closed_as_unavailable
from toolbus._host_tools import CallContext, HostTool

log = logging.getLogger("toolbus.worker")

DROPPED_LOG_EVERY = 60.0
"""Seconds between warnings of dropped consumer deliveries (a flood logs once)."""


class Worker:
    """Serve host tools until stopped.

        async with await Toolbus.connect() as tb:
            await Worker(tb, tools=[find_customer]).run()     # until SIGTERM / SIGINT

    Each attempt gets heartbeats on `host.heartbeat.<callId>.<token>` every quarter of its
    `heartbeatTimeout` from the moment it arrives (also while it waits for one of the
    `concurrency` slots), and one result: the output, or the exception's message as the error. The
    result goes to the task's reply subject, which the dispatcher sets to
    `host.result.<callId>.<token>`, a token per attempt (a worker whose NATS user has
    `allow_responses` and no other permission on `host.result.>`, as in deploy/nats/, can publish
    there once, and only for calls it was sent); with no such reply subject, to
    `host.result.<callId>` itself.

    On `stop()` (SIGTERM under `run()`) the worker unsubscribes, so new calls go to other workers,
    and waits up to `grace` seconds for the calls it holds; any still running then are cancelled
    and their heartbeats stop, so the dispatcher treats them as interrupted (sent again under
    `retry`, `outcomeUnknown` under `at_most_once`).
    """

    def __init__(
        self,
        tb: Core,
        tools: Iterable[HostTool],
        *,
        concurrency: int = 8,
        grace: float = 30.0,
        queue: str = WORKER_QUEUE,
    ) -> None:
        self._tb = tb
        self.tools = {t.name: t for t in tools}
        if not self.tools:
            raise ValueError("a worker needs at least one host tool")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.concurrency = concurrency
        self.grace = grace
        self._queue = queue
        self._slots = asyncio.Semaphore(concurrency)
        self._subs: list[Subscription] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._running: dict[str, tuple[int, asyncio.Task[None]]] = {}
        """Attempts by their cancel subject (`host.cancel.<token>`): number and task."""
        self._given_up: set[asyncio.Task[None]] = set()
        """Attempts being stopped because the dispatcher gave them up."""
        self._cancel_sub: Subscription | None = None
        self._dropped_logged = -DROPPED_LOG_EVERY
        self._stopped = asyncio.Event()
        self.ready = asyncio.Event()
        """Set once the server holds every subscription (`start()` returned)."""
        self.completed = 0
        """Attempts answered since start (results published)."""
        self.handed_back = 0
        """Attempts given up at the last stop (still running after `grace`)."""
        self.cancelled = 0
        """Attempts stopped because the dispatcher gave them up (`host.cancel`): no result sent."""

    @property
    def in_flight(self) -> int:
        """Attempts received and not yet answered."""
        return len(self._tasks)

    async def start(self) -> None:
        """Subscribe to every tool's subject; returns once the server has the subscriptions."""
        cancels = self._tb.subjects.host_cancels
        with closed_as_unavailable(cancels):
            self._cancel_sub = await self._tb.nc.subscribe(cancels, cb=self._on_cancel)
        for name in self.tools:
            subject = self._tb.subjects.host_call(name)
            with closed_as_unavailable(subject):
                self._subs.append(await self._tb.nc.subscribe(subject, queue=self._queue, cb=self._on_task))
        with closed_as_unavailable(self._tb.subjects.host_call("*")):
            await flush(self._tb.nc)
        self.ready.set()
        log.info("serving host tools %s", ", ".join(sorted(self.tools)))

    async def stop(self, grace: float | None = None) -> int:
        """Stop taking calls, wait for the ones held (up to `grace` s), hand back the rest;
        returns how many were handed back."""
        subs, self._subs = self._subs, []
        for sub in subs:
            with contextlib.suppress(Exception):
                await sub.drain()  # type: ignore[no-untyped-call]
        wait = self.grace if grace is None else grace
        handed_back = 0
        if self._tasks:
            log.info("stopping: finishing %d call(s) in flight (up to %gs)", len(self._tasks), wait)
            _, pending = await asyncio.wait(set(self._tasks), timeout=wait)
            handed_back = len(pending)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        if self._cancel_sub is not None:  # kept through the grace: attempts held may be given up
            with contextlib.suppress(Exception):
                await self._cancel_sub.unsubscribe()
            self._cancel_sub = None
        with contextlib.suppress(Exception):
            await flush(self._tb.nc)
        self._stopped.set()
        self.handed_back = handed_back
        return handed_back

    async def run(self, *, handle_signals: bool = True) -> int:
        """`start()`, serve until `stop()` or (with `handle_signals`) SIGTERM / SIGINT, then stop;
        returns how many calls were handed back."""
        await self.start()
        stop_requested = asyncio.Event()
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.add_signal_handler(sig, stop_requested.set)
                    installed.append(sig)
        try:
            waiters = {
                asyncio.ensure_future(stop_requested.wait()),
                asyncio.ensure_future(self._stopped.wait()),
            }
            _, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for w in pending:
                w.cancel()
            if not self._stopped.is_set():
                self.handed_back = await self.stop()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
        return self.handed_back

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._stopped.is_set():
            await self.stop()

    # ---- one attempt --------------------------------------------------------------------------

    async def _on_task(self, msg: Msg) -> None:
        # No ack on the reply subject: it is where the result goes, and a worker user may publish
        # there once per call.
        if consumer_delivery(self._tb.subjects.host_call(">"), msg.subject, msg.reply, msg.headers):
            # Not the dispatcher's: a JetStream consumer's delivery aimed here (its bytes may be a
            # tool output stored by reference, anyone's), never run; a flood logs once a minute.
            now = time.monotonic()
            if now - self._dropped_logged >= DROPPED_LOG_EVERY:
                self._dropped_logged = now
                log.warning(
                    "dropped a message a JetStream consumer delivered to the host-call subjects "
                    "(only the first a minute is logged)"
                )
            return
        try:
            task = HostCallTask.from_task(orjson.loads(msg.data))
        except (orjson.JSONDecodeError, ValidationError, TypeError):
            log.warning("dropped a host task that is not a HostCallTask on %s", msg.subject)
            return
        result_prefix = self._tb.subjects.host_result("")
        # An older dispatcher sends the task as a request with an inbox reply subject: answer on
        # host.result.<callId> then, as the contract says.
        reply = msg.reply if msg.reply.startswith(result_prefix) else result_prefix + task.call_id
        # The attempt's token (in a current dispatcher's reply subject) names its heartbeats and
        # where it is cancelled; an older dispatcher's reply subject has none.
        own = self._tb.subjects.host_result(task.call_id) + "."
        tail = reply.removeprefix(own) if reply.startswith(own) else ""
        token = tail if tail.isalnum() else None
        job = asyncio.create_task(self._serve(task, reply, token))
        self._tasks.add(job)
        job.add_done_callback(self._tasks.discard)
        if token is not None:
            cancel = self._tb.subjects.host_cancel(token)
            self._running[cancel] = (task.attempt, job)
            job.add_done_callback(lambda _: self._forget(cancel, job))

    def _forget(self, cancel: str, job: asyncio.Task[None]) -> None:
        if self._running.get(cancel, (0, None))[1] is job:
            del self._running[cancel]
        self._given_up.discard(job)

    async def _on_cancel(self, msg: Msg) -> None:
        """The dispatcher gave an attempt up (run closed, call moved, heartbeats missed, its
        timeout): stop running it, send nothing."""
        running = self._running.get(msg.subject)
        if running is None or consumer_delivery(
            self._tb.subjects.host_cancels, msg.subject, msg.reply, msg.headers
        ):
            return
        try:
            attempt = HostCancel.model_validate_json(msg.data).attempt
        except ValidationError:
            return
        number, job = running
        if attempt == number and not job.done():
            self._given_up.add(job)
            job.cancel()

    async def _serve(self, task: HostCallTask, reply: str, token: str | None = None) -> None:
        limit = duration_seconds(task.timeout) if task.timeout is not None else None
        deadline = None if limit is None else asyncio.get_running_loop().time() + limit
        beat = asyncio.create_task(self._heartbeat(task, token))
        result: dict[str, Any]
        try:
            async with asyncio.timeout_at(deadline) as budget:
                result = await self._attempt(task)
        except asyncio.CancelledError:
            if asyncio.current_task() in self._given_up:  # host.cancel: nothing to answer
                self.cancelled += 1
                log.info("stopped call %s attempt %d: the dispatcher gave it up", task.call_id, task.attempt)
                return
            log.info("handed back call %s attempt %d", task.call_id, task.attempt)  # stop()
            raise
        except TimeoutError:
            if not budget.expired():
                raise
            # The dispatcher's clock for this attempt started before ours: it has given the
            # attempt up (sent it again, or ended the call), so its slot goes to the next call.
            log.info(
                "gave up call %s attempt %d: past the tool's timeout %s",
                task.call_id,
                task.attempt,
                task.timeout,
            )
            return
        finally:
            beat.cancel()
        try:
            data = orjson.dumps(result)
        except TypeError as exc:
            data = orjson.dumps({"attempt": task.attempt, "error": {"message": f"output is not JSON: {exc}"}})
        try:
            await self._tb.nc.publish(reply, data)
        except MaxPayloadError:  # raised before anything is sent: the reply is still unused
            message = f"the output ({len(data)} bytes) is larger than one NATS message"
            await self._tb.nc.publish(
                reply,
                orjson.dumps({"attempt": task.attempt, "error": {"message": message}}),
            )
        await flush(self._tb.nc)
        self.completed += 1

    async def _attempt(self, task: HostCallTask) -> dict[str, Any]:
        """Wait for a slot, run the tool; the result to publish (output, or the error)."""
        async with self._slots:
            tool = self.tools.get(task.tool)
            context = CallContext(
                call_id=task.call_id,
                attempt=task.attempt,
                idempotency_key=task.idempotency_key,
                run_id=task.run_id,
                namespace=task.namespace,
                toolset_id=task.toolset_id,
                tool=task.tool,
            )
            try:
                if tool is None:
                    raise LookupError(f"this worker does not serve host tool '{task.tool}'")
                return {"attempt": task.attempt, "output": await tool.invoke(task.input, context)}
            except Exception as exc:  # the tool's own TimeoutError included: its error
                log.info("host tool %s failed on call %s: %s", task.tool, task.call_id, type(exc).__name__)
                return {"attempt": task.attempt, "error": {"message": str(exc) or type(exc).__name__}}

    async def _heartbeat(self, task: HostCallTask, token: str | None) -> None:
        """On the attempt's own `host.heartbeat.<callId>.<token>` (an older dispatcher, which sent
        no token: the bare subject), with the attempt in the body either way."""
        every = max(0.05, duration_seconds(task.heartbeat_timeout) / 4)
        subject = self._tb.subjects.host_heartbeat(task.call_id, token)
        body = orjson.dumps({"attempt": task.attempt})
        while True:
            with contextlib.suppress(Exception):
                await self._tb.nc.publish(subject, body)
            await asyncio.sleep(every)
