"""The secured NATS configuration (deploy/nats/) against a real nats-server: each role can do what
it needs and is refused what it must not.

The oracle of the matrix is the server itself: a refused publish or subscription is answered
`-ERR 'Permissions Violation ...'` before the PONG of the flush that follows it, so once
`flush()` returns the refusal has reached the client's error callback, or there was none.
The scenarios then run the flows each role needs end to end (requests across private inboxes,
host calls with one reply allowed, JetStream streams and object stores read and written).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypedDict

import nats
import pytest
from nats.aio.client import Client
from nats.js.api import ConsumerConfig
from toolbus import Toolbus, Worker, host_tool
from toolbus._stored import read_object, replay
from toolbus_common.connections import ensure_object_store, ensure_stream, flush
from toolbus_common.toolsets import Tool
from toolbus_contracts import WORKER_QUEUE, Subjects, consumer_delivery
from toolbus_contracts.errors import UpstreamError
from toolbus_contracts.registry import EffectivePolicy, PolicySpec
from toolbus_devstack import free_port, start_nats_server
from toolbus_devstack.nats_conf import dev_nkeys, js_name, render_auth_conf
from toolbus_dispatcher.executors.base import Attempt, Interrupted
from toolbus_dispatcher.executors.host import HostExecutor
from toolbus_dispatcher.records import CallRecord
from toolbus_nats_connect import NatsAuth

from tests.system.security.conftest import SecuredNats

pytestmark = pytest.mark.integration

P = "toolbus"
ROOT = Path(__file__).resolve().parents[3]


class NatsCredentials(TypedDict, total=False):
    """What `connect` is given to log in with: a user and password, or nothing (anonymous)."""

    user: str
    password: str


class Probe:
    """A connection as one role that records the server's permission refusals."""

    def __init__(self, nc: Client, errors: list[str]) -> None:
        self.nc = nc
        self.errors = errors
        self._markers = 0

    def _seen(self, kind: str, subject: str, since: int) -> int | None:
        needle = f'permissions violation for {kind} to "{subject.lower()}"'
        for i, error in enumerate(self.errors[since:], start=since):
            if error.lower().endswith(needle):
                return i
        return None

    async def refused(self, action: str, subject: str, payload: bytes = b"{}") -> bool:
        """Do `action` on `subject`, then publish a marker no role may publish: the server reports
        refusals of one connection in order, so once the marker's refusal is in, the probe's is in
        too, or there was none."""
        before = len(self.errors)
        if action == "pub":
            await self.nc.publish(subject, payload)
        elif action == "sub":
            await self.nc.subscribe(subject)
        else:  # "qsub": in the workers' queue group
            await self.nc.subscribe(subject, queue="toolbus-workers")
        self._markers += 1
        marker = f"probe-marker.{self._markers}"
        await self.nc.publish(marker, b"")
        await self.nc.flush(timeout=5)
        for _ in range(500):  # bounded: 10 s
            if self._seen("publish", marker, before) is not None:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError(f"the server never refused the marker {marker}")
        return self._seen("subscription" if action != "pub" else "publish", subject, before) is not None


@asynccontextmanager
async def connect_as(secured: SecuredNats, role: str) -> AsyncIterator[Probe]:
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    env = secured.env(role)
    options = NatsAuth.from_env(env).connect_options()
    nc = await nats.connect(**options, error_cb=on_error, allow_reconnect=False, connect_timeout=5)
    try:
        yield Probe(nc, errors)
    finally:
        await nc.close()


# (role, action, subject, allowed): what the report's permission matrix lists.
MATRIX: list[tuple[str, str, str, bool]] = [
    # harness: the public API, its own inbox, events of calls; nothing internal
    ("harness", "pub", f"{P}.toolsets.create", True),
    ("harness", "pub", f"{P}.calls.invoke", True),
    ("harness", "pub", f"{P}.runs.credentials.set", True),
    ("harness", "pub", f"$JS.API.DIRECT.GET.{P}_EVENTS", True),
    ("harness", "pub", f"$JS.API.DIRECT.GET.OBJ_{P}_outputs.$O.{P}_outputs.M.x", True),
    # no consumers, no stream info: a client's one JetStream request is the direct get
    ("harness", "pub", f"$JS.API.CONSUMER.CREATE.{P}_EVENTS", False),
    ("harness", "pub", f"$JS.API.CONSUMER.CREATE.OBJ_{P}_outputs", False),
    ("harness", "pub", f"$JS.API.STREAM.INFO.{P}_EVENTS", False),
    ("harness", "pub", "$JS.API.INFO", False),
    ("harness", "sub", f"{P}.events.calls.run1.*", True),
    ("harness", "sub", "_INBOX.harness.abc", True),
    ("harness", "pub", f"{P}.approvals.decide", False),
    ("harness", "pub", f"{P}.approvals.list", False),
    ("harness", "pub", f"{P}.internal.approvals.decided", False),
    ("harness", "pub", f"{P}.internal.calls.resume", False),
    ("harness", "pub", f"{P}.credentials.changed", False),
    ("harness", "pub", f"{P}.events.calls.run1.call1", False),
    ("harness", "pub", f"{P}.host.result.call1", False),
    ("harness", "pub", f"{P}.host.cancel.t0", False),
    ("harness", "sub", f"{P}.host.cancel.*", False),
    ("harness", "pub", f"{P}.workflows.publish", False),
    ("harness", "pub", f"$JS.API.STREAM.INFO.OBJ_{P}_toolsets", False),
    ("harness", "pub", f"$JS.API.CONSUMER.CREATE.{P}_INTERNAL", False),
    ("harness", "pub", f"$JS.API.STREAM.DELETE.{P}_EVENTS", False),
    ("harness", "pub", f"$O.{P}_toolsets.M.x", False),
    ("harness", "sub", "_INBOX.>", False),
    ("harness", "sub", "_INBOX.dispatcher.>", False),
    ("harness", "sub", f"{P}.calls.start", False),
    ("harness", "sub", f"{P}.toolsets.credentials.set", False),
    ("harness", "sub", f"{P}.internal.>", False),
    ("harness", "sub", f"{P}.host.call.>", False),
    ("harness", "sub", f"{P}.events.approvals.requested", False),
    ("harness", "sub", f"$O.{P}_toolsets.>", False),
    # worker: host calls only in the queue group; heartbeats and results
    ("worker", "qsub", f"{P}.host.call.crm.find_customer", True),
    ("worker", "pub", f"{P}.host.heartbeat.call1", True),
    ("worker", "pub", f"{P}.host.heartbeat.call1.t0", True),
    ("worker", "sub", f"{P}.host.cancel.*", True),
    ("worker", "pub", f"{P}.host.cancel.t0", False),
    # a result only as the reply to a call it was sent (see the host-call tests below)
    ("worker", "pub", f"{P}.host.result.call1", False),
    ("worker", "sub", f"{P}.host.call.>", False),
    ("worker", "sub", f"{P}.host.result.*", False),
    ("worker", "sub", f"{P}.events.>", False),
    ("worker", "sub", "_INBOX.>", False),
    ("worker", "pub", "_INBOX.dispatcher.forged", False),
    ("worker", "pub", f"{P}.calls.start", False),
    ("worker", "pub", f"$JS.API.STREAM.INFO.OBJ_{P}_toolsets", False),
    ("worker", "pub", f"$JS.API.DIRECT.GET.OBJ_{P}_toolsets", False),
    ("worker", "pub", f"$JS.API.CONSUMER.CREATE.OBJ_{P}_toolsets", False),
    # approver: list and decide
    ("approver", "pub", f"{P}.approvals.decide", True),
    ("approver", "pub", f"{P}.approvals.list", True),
    ("approver", "sub", f"{P}.events.approvals.requested", True),
    ("approver", "pub", f"{P}.internal.approvals.decided", False),
    ("approver", "pub", f"{P}.calls.start", False),
    ("approver", "sub", f"{P}.approvals.decide", False),
    # workflow engine: serve workflows, call tools
    ("workflow-engine", "sub", f"{P}.workflows.start.triage", True),
    ("workflow-engine", "pub", f"{P}.calls.invoke", True),
    ("workflow-engine", "pub", f"{P}.internal.runs.closed", False),
    ("workflow-engine", "sub", f"{P}.host.call.>", False),
    # services: internal.> only for services, and each only its own commands
    ("approval", "pub", f"{P}.internal.approvals.decided", True),
    ("approval", "pub", f"{P}.events.approvals.requested", True),
    ("approval", "pub", f"{P}.internal.calls.resume", False),
    ("approval", "pub", f"{P}.events.calls.run1.call1", False),
    ("credentials", "pub", f"{P}.internal.calls.resume", True),
    ("credentials", "sub", f"{P}.toolsets.credentials.set", True),
    ("credentials", "pub", f"{P}.internal.approvals.decided", False),
    ("registry", "sub", f"{P}.toolsets.create", True),
    ("registry", "pub", f"$JS.API.STREAM.CREATE.OBJ_{P}_toolsets", True),
    ("registry", "pub", f"{P}.internal.approvals.decided", False),
    ("registry", "pub", f"$JS.API.STREAM.INFO.{P}_INTERNAL", False),
    ("dispatcher", "pub", f"{P}.host.call.crm.find_customer", True),
    ("dispatcher", "pub", f"{P}.host.cancel.t0", True),
    ("dispatcher", "pub", f"{P}.events.calls.run1.call1", True),
    ("dispatcher", "pub", f"{P}.internal.approvals.needed", True),
    ("dispatcher", "sub", f"{P}.host.result.>", True),
    ("dispatcher", "pub", f"{P}.internal.approvals.decided", False),
    ("dispatcher", "pub", f"$KV.{P}_workflows.triage", False),
    ("dispatcher", "sub", f"{P}.toolsets.credentials.set", False),
]


def test_the_committed_configuration_is_the_generated_one() -> None:
    """deploy/nats/toolbus-auth.conf is `render_auth_conf()`'s output: the matrix has one source."""
    committed = (ROOT / "deploy" / "nats" / "toolbus-auth.conf").read_text()
    assert committed == render_auth_conf(P)


async def test_anonymous_and_wrong_passwords_are_refused(secured_nats: SecuredNats) -> None:
    refused: tuple[NatsCredentials, ...] = ({}, {"user": "harness", "password": "wrong"})
    for credentials in refused:
        client = Client()
        try:
            with pytest.raises(nats.errors.Error, match="Authorization Violation"):
                await client.connect(
                    secured_nats.url, allow_reconnect=False, connect_timeout=5, **credentials
                )
        finally:
            await client.close()


async def test_each_role_is_allowed_and_refused_as_the_matrix_says(secured_nats: SecuredNats) -> None:
    wrong: list[str] = []
    for role in sorted({row[0] for row in MATRIX}):
        async with connect_as(secured_nats, role) as probe:
            for who, action, subject, allowed in MATRIX:
                if who != role:
                    continue
                refused = await probe.refused(action, subject)
                if refused == allowed:
                    wrong.append(f"{role} {action} {subject}: {'refused' if refused else 'allowed'}")
    assert wrong == []


async def test_requests_cross_private_inboxes_and_a_worker_answers_a_host_call_once(
    secured_nats: SecuredNats,
) -> None:
    """harness -> registry (reply to `_INBOX.harness.*`), dispatcher -> worker (the call's reply
    subject is `host.result.<callId>`, which the worker may publish to once, by `allow_responses`).

    Every `subscribe()` is followed by `flush(nc)`, not `nc.flush()`: nats-py writes a flush's PING
    ahead of the SUB lines still in its buffer, so under load the request on the other connection
    could reach the server first (the NoRespondersError this test used to flake with)."""
    async with (
        connect_as(secured_nats, "harness") as harness,
        connect_as(secured_nats, "registry") as registry,
        connect_as(secured_nats, "dispatcher") as dispatcher,
        connect_as(secured_nats, "worker") as worker,
    ):

        async def serve_get(msg: Any) -> None:
            await msg.respond(b'{"ok": true, "data": {"id": "ts_x"}}')

        await registry.nc.subscribe(f"{P}.toolsets.get", queue="toolbus-registry", cb=serve_get)
        await flush(registry.nc)
        reply = await harness.nc.request(f"{P}.toolsets.get", b'{"id": "ts_x"}', timeout=5)
        assert json.loads(reply.data)["data"]["id"] == "ts_x"
        assert reply.subject.startswith("_INBOX.harness.")

        results: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_result(msg: Any) -> None:
            results.put_nowait(msg.data)

        await dispatcher.nc.subscribe(f"{P}.host.result.*", cb=on_result)
        replies: list[str] = []

        async def serve_call(msg: Any) -> None:
            replies.append(msg.reply)
            call = json.loads(msg.data)
            await worker.nc.publish(
                f"{P}.host.result.{call['callId']}", b'{"attempt": 1, "output": {"a": 1}}'
            )

        await worker.nc.subscribe(f"{P}.host.call.crm.find", queue="toolbus-workers", cb=serve_call)
        await flush(worker.nc)
        await flush(dispatcher.nc)
        await dispatcher.nc.publish(
            f"{P}.host.call.crm.find", b'{"callId": "c1"}', reply=f"{P}.host.result.c1"
        )
        assert json.loads(await asyncio.wait_for(results.get(), 5)) == {"attempt": 1, "output": {"a": 1}}
        assert replies == [f"{P}.host.result.c1"]
        # allow_responses permits one reply per request: a second one to the same subject is refused.
        assert await worker.refused("pub", replies[0])
        assert worker._seen("publish", f"{P}.host.result.c1", 0) is not None


def _host_tool(name: str, heartbeat: str = "10s") -> Tool:
    policy = EffectivePolicy.for_kind("host", PolicySpec(heartbeat_timeout=heartbeat))
    return Tool({"name": name, "kind": "host"}, policy, name, name)


def _as_the_bus(subscribed: str, handler: Any) -> Any:
    """`handler` behind the check every listening subscription of the bus makes
    (`toolbus_common.bus`): a stored message JetStream handed out is dropped unread."""

    async def listen(msg: Any) -> None:
        if not consumer_delivery(subscribed, msg.subject, msg.reply, msg.headers):
            await handler(msg)

    return listen


def _attempt(call_id: str, tool: Tool, number: int = 1) -> Attempt:
    call = CallRecord(
        call_id, "run_x", tool.name, "{}", "key-" + call_id, "ts_x", None, "retry", number, "running"
    )
    return Attempt(call, tool, number, {"id": "42"}, None)


async def test_a_worker_may_answer_only_a_call_it_was_sent_and_only_once(secured_nats: SecuredNats) -> None:
    """The dispatcher's own HostExecutor sends call X to the SDK Worker (one `worker` connection),
    which publishes its result to the call's reply subject: the call completes with it. A second
    `worker` connection, which was not sent X, publishing `host.result.X` (with the right attempt
    number) is refused by the server and does not complete the call; the first worker's second
    result for the same attempt is refused too."""
    started = asyncio.Event()
    release = asyncio.Event()

    @host_tool(name="crm.lookup")
    async def lookup(id: str) -> dict[str, str]:
        started.set()
        await release.wait()
        return {"name": f"customer {id}"}

    async with (
        connect_as(secured_nats, "dispatcher") as dispatcher,
        connect_as(secured_nats, "worker") as sent,
        connect_as(secured_nats, "worker") as other,
    ):
        subjects = Subjects(P)
        host = HostExecutor(dispatcher.nc, subjects)
        await dispatcher.nc.subscribe(
            subjects.host_results, cb=_as_the_bus(subjects.host_results, host.on_result)
        )
        await dispatcher.nc.subscribe(
            subjects.host_heartbeats, cb=_as_the_bus(subjects.host_heartbeats, host.on_heartbeat)
        )
        await flush(dispatcher.nc)
        tb = Toolbus(sent.nc, P, owns_connection=False)
        async with Worker(tb, tools=[lookup]):
            call = asyncio.create_task(host.execute(_attempt("call_x1", _host_tool("crm.lookup"))))
            await asyncio.wait_for(started.wait(), 10)
            tokens = [host._waiters["call_x1"].token]
            # The other worker connection forges X's result while X runs: refused, X still runs.
            forged = json.dumps({"attempt": 1, "output": {"name": "forged"}}).encode()
            assert await other.refused("pub", subjects.host_result("call_x1"), forged)
            assert not call.done()
            release.set()
            output = await asyncio.wait_for(call, 10)
            assert output == {"name": "customer 42"}
            assert sent._seen("publish", subjects.host_result("call_x1"), 0) is None
            # The worker that was sent X: a second result for the same attempt, on the attempt's
            # own reply subject (the only one it was granted), is refused.
            assert await sent.refused("pub", subjects.host_result("call_x1", tokens[0]), forged)

        # No worker subscribed: the server's no-responders status comes to the dispatcher's own
        # host.result.> subscription, and the attempt was never sent (on 2.15 the status carries
        # a Nats-Subject header, which the bus's check once took for a stored message's).
        with pytest.raises(Interrupted) as unsent:
            await asyncio.wait_for(host.execute(_attempt("call_x2", _host_tool("crm.nobody"))), 10)
        assert unsent.value.sent is False
        assert unsent.value.error.code == "upstreamUnreachable"


async def test_jetstream_streams_and_stores_are_reachable_only_by_their_roles(
    secured_nats: SecuredNats,
) -> None:
    async with (
        connect_as(secured_nats, "dispatcher") as dispatcher,
        connect_as(secured_nats, "registry") as registry,
        connect_as(secured_nats, "credentials") as credentials,
        connect_as(secured_nats, "harness") as harness,
        connect_as(secured_nats, "worker") as worker,
    ):
        djs = dispatcher.nc.jetstream(timeout=3)
        await ensure_stream(djs, f"{P}_EVENTS", [f"{P}.events.>"], allow_direct=True)
        await djs.publish(f"{P}.events.calls.run1.call1", b'{"type": "accepted"}')
        # The harness replays a run's events with direct gets, through its account's import.
        hjs = harness.nc.jetstream(timeout=3)
        replayed = [
            json.loads(m.data or b"") async for _, m in replay(hjs, f"{P}_EVENTS", f"{P}.events.calls.run1.*")
        ]
        assert replayed == [{"type": "accepted"}]
        # ... and reads an output the dispatcher stored by reference, chunk by chunk.
        outputs = await ensure_object_store(djs, f"{P}_outputs")
        big = bytes(range(256)) * 1200  # three chunks
        await outputs.put("call1-out", big)
        assert await read_object(hjs, f"{P}_outputs", "call1-out") == big
        # It creates no consumer: its account imports no consumer API.
        with pytest.raises(nats.errors.TimeoutError):
            await hjs.subscribe(f"{P}.events.calls.run1.*", stream=f"{P}_EVENTS", ordered_consumer=True)

        # The registry writes the toolsets store; the dispatcher and credentials read it.
        store = await ensure_object_store(registry.nc.jetstream(timeout=3), f"{P}_toolsets")
        await store.put("ts_abc", b'{"pinned": true}')
        for reader in (dispatcher, credentials):
            got = await (await reader.nc.jetstream(timeout=3).object_store(f"{P}_toolsets")).get("ts_abc")
            assert got.data == b'{"pinned": true}'
        # A worker or a harness can neither open nor read it.
        for outsider in (worker, harness):
            with pytest.raises((nats.errors.TimeoutError, nats.js.errors.Error)):
                await outsider.nc.jetstream(timeout=1).object_store(f"{P}_toolsets")
            assert outsider._seen("publish", f"$JS.API.STREAM.INFO.OBJ_{P}_toolsets", 0) is not None
        # The harness may not publish into the stream's subjects as if it were the dispatcher.
        assert await harness.refused("pub", f"{P}.events.calls.run1.call2")


async def test_nkey_users_get_the_same_permissions(tmp_path: Path) -> None:
    """`render_auth_conf(nkeys=...)`: the same matrix with nkey users (no password anywhere); a
    client signs with its seed file (`TOOLBUS_NATS_NKEY_FILE`)."""
    keys = dev_nkeys()
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "nats-server.conf").write_text((ROOT / "deploy" / "nats" / "nats-server.conf").read_text())
    (conf_dir / "toolbus-auth.conf").write_text(
        render_auth_conf(P, nkeys={r: pub for r, (_, pub) in keys.items()})
    )
    server = start_nats_server(
        free_port(), tmp_path / "store", tmp_path / "nats.log", config=conf_dir / "nats-server.conf"
    )
    try:
        seed_file = tmp_path / "worker.nk"
        seed_file.write_text(keys["worker"][0])
        env = {
            "TOOLBUS_NATS_URL": server.url,
            "TOOLBUS_NATS_NKEY_FILE": str(seed_file),
            "TOOLBUS_NATS_INBOX_PREFIX": "_INBOX.worker",
        }
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        nc = await nats.connect(
            **NatsAuth.from_env(env).connect_options(), error_cb=on_error, allow_reconnect=False
        )
        try:
            probe = Probe(nc, errors)
            assert not await probe.refused("qsub", f"{P}.host.call.crm.find_customer")
            assert await probe.refused("sub", f"{P}.host.call.>")
            assert await probe.refused("pub", f"{P}.calls.start")
        finally:
            await nc.close()
    finally:
        server.stop()


async def test_answers_sent_to_a_heartbeat_subject_keep_no_attempt_alive(nats_url: str) -> None:
    """Any user can name any reply subject in a request, and nats-server answers there whatever
    that user may publish on: a harness can have JetStream API answers sent to a call's bare
    heartbeat subject, and the empty, header-less answer to an ack of a consumer it made. Neither
    carries the running attempt, so neither is a heartbeat there (an empty body is one only on the
    attempt's own `host.heartbeat.<callId>.<token>`): the attempt of a worker that went silent is
    still interrupted. An outside probe kept such an attempt alive with the acks until the empty
    body stopped counting on the bare subject."""
    subjects = Subjects(f"tbhb{uuid.uuid4().hex[:8]}")
    stream = js_name(subjects.prefix, "HB")
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    seen: list[bytes] = []

    async def watch(msg: Any) -> None:
        seen.append(msg.data)

    try:
        await js.add_stream(name=stream, subjects=[f"{subjects.prefix}.hbstored.>"])
        await js.add_consumer(stream, config=ConsumerConfig(durable_name="forger"))
        host = HostExecutor(nc, subjects)
        await nc.subscribe(subjects.host_results, cb=_as_the_bus(subjects.host_results, host.on_result))
        await nc.subscribe(
            subjects.host_heartbeats, cb=_as_the_bus(subjects.host_heartbeats, host.on_heartbeat)
        )
        await nc.subscribe(subjects.host_heartbeat("call_hb1"), cb=watch)
        await nc.subscribe(subjects.host_call("crm.silent"), queue=WORKER_QUEUE, cb=_ignore)
        await flush(nc)
        call = asyncio.create_task(host.execute(_attempt("call_hb1", _host_tool("crm.silent", "500ms"))))
        answers = 0
        bare = subjects.host_heartbeat("call_hb1")
        for _ in range(40):  # 4 s of answers, far past the 500 ms heartbeat timeout
            if call.done():
                break
            await nc.publish("$JS.API.INFO", b"", reply=bare)
            await nc.publish(f"$JS.ACK.{stream}.forger.1.1.1.1.0", b"+WPI", reply=bare)
            answers += 1
            await asyncio.sleep(0.1)
        assert call.done() and answers < 30, answers  # interrupted while the answers kept coming
        with pytest.raises(Interrupted):
            await call
        assert b"" in seen  # the ack's empty answer did reach the heartbeat subject
    finally:
        with contextlib.suppress(Exception):
            await js.delete_stream(stream)
        await nc.close()


async def test_answers_sent_to_a_result_subject_end_no_attempt(nats_url: str) -> None:
    """A harness can have JetStream's or a service's answers sent to a call's bare
    `host.result.<callId>` (call ids are in the events it reads), and a no-responders status too
    where the server sends one there (here on the dispatcher's own connection, the worst case).
    None of them is the worker's: the attempt goes on, and the worker's answer on its reply
    subject, `host.result.<callId>.<token>`, ends it. The next attempt has a token of its own, so
    a garbled late answer of the first one ends nothing either. (On the contract's one subject
    per call, each of these ended the attempt `upstreamError` or as never sent.)"""
    subjects = Subjects(f"tbres{uuid.uuid4().hex[:8]}")
    stream = js_name(subjects.prefix, "STORED")
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    tasks: list[Any] = []
    got = asyncio.Event()

    async def worker(msg: Any) -> None:
        tasks.append(msg)
        got.set()

    try:
        host = HostExecutor(nc, subjects)
        await nc.subscribe(subjects.host_results, cb=_as_the_bus(subjects.host_results, host.on_result))
        await nc.subscribe(
            subjects.host_heartbeats, cb=_as_the_bus(subjects.host_heartbeats, host.on_heartbeat)
        )
        await nc.subscribe(subjects.host_call("crm.slow"), queue=WORKER_QUEUE, cb=worker)
        await flush(nc)
        bare = subjects.host_result("call_r1")

        first = asyncio.create_task(host.execute(_attempt("call_r1", _host_tool("crm.slow", "1s"))))
        await asyncio.wait_for(got.wait(), 10)
        reply1 = tasks[0].reply
        assert reply1.startswith(bare + ".") and len(reply1) == len(bare) + 33
        await nc.publish("$JS.API.INFO", b"", reply=bare)  # JetStream's JSON answer
        await nc.publish(f"{subjects.prefix}.nobody.listens", b"", reply=bare)  # Status: 503
        for body in (b"not json", b"[1]", b'{"output": 1}', b'{"attempt": "1"}'):
            await nc.publish(bare, body)
        # A call's own attemptStarted event is a well-formed result of the running attempt: a
        # direct get of it (a harness may read EVENTS) is dropped as a stored message, by the
        # check every listening subscription of the bus makes (`_as_the_bus`).
        await js.add_stream(name=stream, subjects=[f"{subjects.prefix}.stored.>"], allow_direct=True)
        await js.publish(f"{subjects.prefix}.stored.e", b'{"type": "attemptStarted", "attempt": 1}')
        await nc.publish(f"$JS.API.DIRECT.GET.{stream}", b'{"seq": 1}', reply=bare)
        await flush(nc)
        await asyncio.sleep(0.3)
        assert not first.done()
        with pytest.raises(Interrupted) as missed:  # the worker never heartbeat: interrupted
            await asyncio.wait_for(first, 10)
        assert missed.value.error.code == "timeout"

        got.clear()
        second = asyncio.create_task(host.execute(_attempt("call_r1", _host_tool("crm.slow"), 2)))
        await asyncio.wait_for(got.wait(), 10)
        reply2 = tasks[1].reply
        assert reply2 != reply1 and reply2.startswith(bare + ".")
        await nc.publish(reply1, b"garbled, from the first attempt's worker")
        await nc.publish(reply1, json.dumps({"attempt": 2, "output": "not its own"}).encode())
        await flush(nc)
        await asyncio.sleep(0.3)
        assert not second.done()
        await nc.publish(reply2, json.dumps({"attempt": 2, "output": {"name": "ok"}}).encode())
        assert await asyncio.wait_for(second, 10) == {"name": "ok"}

        # On its own reply subject, a result for another attempt is the worker's bug.
        got.clear()
        third = asyncio.create_task(host.execute(_attempt("call_r1", _host_tool("crm.slow"), 3)))
        await asyncio.wait_for(got.wait(), 10)
        await nc.publish(tasks[2].reply, json.dumps({"attempt": 2, "output": "stale"}).encode())
        with pytest.raises(UpstreamError):
            await asyncio.wait_for(third, 10)
    finally:
        with contextlib.suppress(Exception):
            await js.delete_stream(stream)
        await nc.close()


async def _ignore(msg: Any) -> None:
    """A worker that takes the task and goes silent."""
