"""The host-tool worker against the real dispatcher: schemas from type hints and pydantic models
registered from the same declaration, the context it passes, heartbeats that keep a long call
alive, its concurrency bound, errors, and SIGTERM mid-call losing no call."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import BaseModel
from toolbus import CallContext, HostTool, Toolbus, ToolError, Worker, host_tool

from tests.support.infra import until

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


class Customer(BaseModel):
    id: str
    email: str


class FindCustomer(BaseModel):
    email: str


@host_tool(name="crm.find_customer", policy={"onInterruption": "at_most_once"})
async def find_customer(query: FindCustomer, ctx: CallContext) -> Customer:
    """Find a customer by email."""
    return Customer(id=f"cus_{ctx.attempt}_{len(ctx.idempotency_key)}", email=query.email)


def test_schemas_come_from_type_hints_and_models() -> None:
    @host_tool
    async def add(a: int, b: int = 2) -> int:
        """Add two numbers."""
        return a + b

    assert isinstance(add, HostTool) and add.name == "add" and add.description == "Add two numbers."
    assert add.input_schema["properties"]["a"] == {"title": "A", "type": "integer"}
    assert add.input_schema["required"] == ["a"]
    assert add.output_schema == {"type": "integer"}
    spec = find_customer.spec()
    assert spec.name == "crm.find_customer"
    assert spec.input_schema["required"] == ["email"]
    assert spec.output_schema is not None and set(spec.output_schema["properties"]) == {"id", "email"}
    assert spec.policy is not None and spec.policy.on_interruption == "at_most_once"


async def test_worker_serves_a_tool_registered_from_its_declaration(tb: Toolbus) -> None:
    toolset = await tb.toolsets.create(host=[find_customer])
    assert toolset.tool("crm.find_customer").input_schema == find_customer.input_schema
    async with Worker(tb, tools=[find_customer]) as worker, await tb.runs.open(toolset) as run:
        out = await run.call("crm.find_customer", {"email": "a@b.c"}, idempotency_key="abcd")
        assert out == {"id": "cus_1_4", "email": "a@b.c"}
        # The worker counts an answer once its flush came back, which may be after the call's
        # reply reached the caller.
        await until(lambda: worker.completed == 1, "the worker counted its answer")


async def test_heartbeats_keep_a_call_longer_than_its_heartbeat_timeout_alive(tb: Toolbus) -> None:
    @host_tool(name="hb.long", policy={"heartbeatTimeout": "500ms", "onInterruption": "at_most_once"})
    async def long(seconds: float) -> dict[str, float]:
        await asyncio.sleep(seconds)
        return {"slept": seconds}

    toolset = await tb.toolsets.create(host=[long])
    async with Worker(tb, tools=[long]), await tb.runs.open(toolset) as run:
        # Four heartbeat timeouts long: without heartbeats, at_most_once would end outcomeUnknown.
        handle = await run.start("hb.long", {"seconds": 2.0})
        assert await handle.result(timeout=30) == {"slept": 2.0}
        assert (await handle.status()).attempts == 1


async def test_concurrency_bound_and_errors(tb: Toolbus) -> None:
    running = 0
    peak = 0
    release = asyncio.Event()

    @host_tool(name="pool.job")
    async def job(n: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            await release.wait()
            if n < 0:
                raise ValueError(f"negative input {n}")
            return n * 10
        finally:
            running -= 1

    toolset = await tb.toolsets.create(host=[job])
    async with Worker(tb, tools=[job], concurrency=2) as worker, await tb.runs.open(toolset) as run:
        handles = [await run.start("pool.job", {"n": n}) for n in (1, 2, 3, 4, -1)]
        while worker.in_flight < 5:  # noqa: ASYNC110 - a plain attribute, no event to wait on
            await asyncio.sleep(0.01)
        # Received is not yet running: wait for the two slots to fill, then give a third a chance.
        await until(lambda: running == 2, "two handlers running")
        await asyncio.sleep(0.2)
        assert running == 2  # five received, two running, three waiting for a slot (heartbeating)
        release.set()
        results = await asyncio.gather(*(h.wait(timeout=30) for h in handles))
    assert [r.output for r in results[:4]] == [10, 20, 30, 40]
    assert peak == 2
    assert isinstance(results[4].error, ToolError) and "negative input -1" in results[4].error.message


async def test_sigterm_mid_call_finishes_the_calls_in_flight(tb: Toolbus, stack: dict[str, str]) -> None:
    started: list[str] = []
    got_started = asyncio.Event()

    async def on_started(msg: Any) -> None:
        started.append(msg.data.decode())
        if len(started) == 2:
            got_started.set()

    sub = await tb.nc.subscribe(f"{tb.prefix}.test.started", cb=on_started)
    env = {**os.environ, **stack, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(  # noqa: ASYNC220 - started once, read in a thread
        [sys.executable, "-m", "tests.sdk.worker_app"], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert (await asyncio.to_thread(proc.stdout.readline)).strip() == "ready"
        from tests.sdk.worker_app import slow_work

        toolset = await tb.toolsets.create(host=[slow_work])
        run = await tb.runs.open(toolset)
        calls = [await run.start("slow.work", {"seconds": 1.5, "tag": t}) for t in ("a", "b")]
        await asyncio.wait_for(got_started.wait(), 30)
        proc.send_signal(signal.SIGTERM)  # both calls are mid-flight
        results = [await c.wait(timeout=30) for c in calls]
        exit_code = await asyncio.to_thread(proc.wait, 30)
        last = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
        await sub.unsubscribe()
    assert exit_code == 0
    assert "stopped 0 completed=2" in last  # nothing handed back: both finished on this worker
    assert [r.output["tag"] for r in results] == ["a", "b"]
    assert all(r.output["attempt"] == 1 for r in results)
    assert [(await c.status()).attempts for c in calls] == [1, 1]
    await run.close()


async def test_the_result_goes_to_the_reply_subject_and_to_host_result_without_one(tb: Toolbus) -> None:
    """The dispatcher sends each task with reply subject `host.result.<callId>.<token>`: the worker's
    result is its reply, nothing else is sent there first. A task with no reply subject, or an
    inbox one (an older dispatcher's request), is answered on `host.result.<callId>` all the same."""

    @host_tool(name="reply.echo")
    async def echo(text: str) -> dict[str, str]:
        return {"text": text}

    seen: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()

    async def on_result(msg: Any) -> None:
        seen.put_nowait((msg.subject, msg.data))

    s = tb.subjects
    sub = await tb.nc.subscribe(s.host_result("*"), cb=on_result)
    try:
        async with Worker(tb, tools=[echo]):
            for n, reply in enumerate([s.host_result("c_r0"), "", "_INBOX.old.dispatcher"]):
                task = {
                    "callId": f"c_r{n}",
                    "attempt": 1,
                    "idempotencyKey": "k",
                    "runId": "run_r",
                    "namespace": None,
                    "toolsetId": "ts_r",
                    "tool": "reply.echo",
                    "input": {"text": str(n)},
                    "heartbeatTimeout": "60s",
                }
                await tb.nc.publish(s.host_call("reply.echo"), orjson.dumps(task), reply=reply)
                subject, data = await asyncio.wait_for(seen.get(), 10)
                assert subject == s.host_result(f"c_r{n}")
                assert orjson.loads(data) == {"attempt": 1, "output": {"text": str(n)}}
        assert seen.empty()  # one message per task: no empty acknowledgement before the result
    finally:
        await sub.unsubscribe()


async def test_an_attempt_past_its_timeout_gives_its_slot_to_the_next_call(tb: Toolbus) -> None:
    """The dispatcher gives an attempt up at the tool's `timeout`: the worker (one slot) stops
    running it then, so a call of another tool is not starved behind a hung one."""
    started = asyncio.Event()
    cancelled = asyncio.Event()

    @host_tool(name="slow.hang", policy={"timeout": "1s", "onInterruption": "at_most_once"})
    async def hang() -> dict[str, str]:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return {}

    @host_tool(name="slow.quick")
    async def quick(text: str) -> dict[str, str]:
        return {"text": text}

    @host_tool(name="slow.own", policy={"timeout": "30s"})
    async def own() -> dict[str, str]:
        raise TimeoutError("the tool's own upstream timed out")

    toolset = await tb.toolsets.create(host=[hang, quick, own])
    tools = [hang, quick, own]
    async with Worker(tb, tools=tools, concurrency=1) as worker, await tb.runs.open(toolset) as run:
        with pytest.raises(ToolError, match="the tool's own upstream timed out"):  # not a given-up attempt
            await run.call("slow.own", {})
        hung = await run.start("slow.hang", {})
        await asyncio.wait_for(started.wait(), 10)
        after = await run.start("slow.quick", {"text": "next"})
        assert (await hung.wait(timeout=30)).error.code == "outcomeUnknown"  # type: ignore[union-attr]
        assert await after.result(timeout=30) == {"text": "next"}
        assert cancelled.is_set()
        await until(lambda: worker.in_flight == 0, "the worker let the hung attempt go")
        assert worker.completed == 2  # slow.own and slow.quick: the given-up attempt published nothing


async def test_fields_a_newer_dispatcher_adds_are_ignored_and_nan_is_no_output(tb: Toolbus) -> None:
    @host_tool(name="odd.nan")
    async def nan(kind: str) -> dict[str, Any]:
        return {"v": [1.0, float(kind)]}

    seen: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_result(msg: Any) -> None:
        seen.put_nowait(msg.data)

    s = tb.subjects
    sub = await tb.nc.subscribe(s.host_result("*"), cb=on_result)
    try:
        async with Worker(tb, tools=[nan]):
            for n, kind in enumerate(["nan", "inf", "2.5"]):
                task = {
                    "callId": f"c_nan{n}",
                    "attempt": 1,
                    "idempotencyKey": "k",
                    "runId": "run_n",
                    "namespace": None,
                    "toolsetId": "ts_n",
                    "tool": "odd.nan",
                    "input": {"kind": kind},
                    "heartbeatTimeout": "60s",
                    "priority": 3,  # a field this worker does not know
                }
                await tb.nc.publish(
                    s.host_call("odd.nan"), orjson.dumps(task), reply=s.host_result(f"c_nan{n}")
                )
                result = orjson.loads(await asyncio.wait_for(seen.get(), 10))
                if kind == "2.5":
                    assert result == {"attempt": 1, "output": {"v": [1.0, 2.5]}}
                else:  # orjson would have written null: the output is refused instead
                    assert result["error"]["message"].startswith("output is not JSON: NaN"), result
    finally:
        await sub.unsubscribe()


async def test_a_call_given_up_by_the_dispatcher_is_stopped_on_the_worker(tb: Toolbus) -> None:
    """`runs.close` ends a running host call `cancelled`; the dispatcher then says so on the
    attempt's `host.cancel.<token>` and the worker stops the tool and sends nothing (it
    used to run on to the end, holding a slot, its result dropped). A cancel with another token
    or another attempt number stops nothing."""
    started = asyncio.Event()
    seen: list[str] = []

    @host_tool(name="cancel.wait")
    async def wait_forever() -> str:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return "never"

    s = tb.subjects
    tasks: asyncio.Queue[Any] = asyncio.Queue()

    async def copy(msg: Any) -> None:  # not in the queue group: a copy of each task
        tasks.put_nowait(msg)

    watch = await tb.nc.subscribe(s.host_call("cancel.wait"), cb=copy)
    toolset = await tb.toolsets.create(host=[wait_forever])
    try:
        async with Worker(tb, tools=[wait_forever]) as worker:
            run = await tb.runs.open(toolset)
            handle = await run.start("cancel.wait", {})
            await asyncio.wait_for(started.wait(), 10)
            task = await asyncio.wait_for(tasks.get(), 10)
            token = task.reply.rsplit(".", 1)[1]
            await tb.nc.publish(s.host_cancel("0" * 32), b'{"attempt": 1}')
            await tb.nc.publish(s.host_cancel(token), b'{"attempt": 2}')
            await tb.nc.publish(s.host_cancel(token), b"not json")
            await tb.nc.flush()
            await asyncio.sleep(0.3)
            assert seen == [] and worker.in_flight == 1
            assert await run.close() == 1
            await until(lambda: worker.cancelled == 1, "the worker stopped the call")
            assert seen == ["cancelled"] and worker.in_flight == 0 and worker.completed == 0
            status = await handle.status()
            assert status.state == "done" and status.result is not None
            assert status.result.error is not None and status.result.error.code == "cancelled"
    finally:
        await watch.unsubscribe()


async def test_a_consumers_delivery_aimed_at_the_workers_is_never_run(
    tb: Toolbus, caplog: pytest.LogCaptureFixture
) -> None:
    """A harness may create consumers on the streams it reads, and nats-server does not check
    where their deliveries go: a stored message (here a task written into a stream of the test's
    own; in the attack, a stored output's chunk) aimed at a tool's subject and the workers' queue
    group is dropped by the worker, while the dispatcher's own task on that subject is served.
    A flood of them is logged once (a minute)."""
    from nats.js.api import AckPolicy, ConsumerConfig
    from toolbus_contracts import WORKER_QUEUE

    ran: list[str] = []

    @host_tool(name="odd.sink")
    async def sink(tag: str) -> str:
        ran.append(tag)
        return tag

    s = tb.subjects
    stream = tb.stream("STORED")
    js = tb.js
    await js.add_stream(name=stream, subjects=[s._s("stored.>")])
    seen: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_result(msg: Any) -> None:
        seen.put_nowait(msg.data)

    sub = await tb.nc.subscribe(s.host_result("*"), cb=on_result)

    def task(call_id: str, tag: str) -> bytes:
        return orjson.dumps(
            {
                "callId": call_id,
                "attempt": 1,
                "idempotencyKey": "k",
                "runId": "run_x",
                "namespace": None,
                "toolsetId": "ts_x",
                "tool": "odd.sink",
                "input": {"tag": tag},
                "heartbeatTimeout": "60s",
            }
        )

    try:
        async with Worker(tb, tools=[sink]):
            for n in range(3):
                await js.publish(s._s("stored.x"), task(f"c_forged{n}", "forged"))
            await js.add_consumer(
                stream,
                config=ConsumerConfig(
                    deliver_subject=s.host_call("odd.sink"),
                    deliver_group=WORKER_QUEUE,
                    ack_policy=AckPolicy.NONE,
                ),
            )
            await asyncio.sleep(1.0)  # delivered at once, if it were taken
            assert ran == []
            dropped = [r for r in caplog.records if "JetStream consumer delivered" in r.getMessage()]
            assert len(dropped) == 1, dropped
            await tb.nc.publish(
                s.host_call("odd.sink"), task("c_real", "real"), reply=s.host_result("c_real")
            )
            assert orjson.loads(await asyncio.wait_for(seen.get(), 10)) == {"attempt": 1, "output": "real"}
            assert ran == ["real"]
    finally:
        await sub.unsubscribe()
        await js.delete_stream(stream)
