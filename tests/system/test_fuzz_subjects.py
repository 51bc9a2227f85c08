"""Bad input at scale: hypothesis generates and mutates bodies for every request subject of the four
services (running as processes on a prefix of their own) and sends them over NATS: JSON of every
shape, wrong types, unknown fields, names with every odd character, non-UTF-8 bytes, empty, huge
and deeply nested bodies. Each request must get exactly one well-formed reply (never `internal`),
no service may restart, and a refused request must change no state (Redis keys and JetStream
streams of the deployment are compared before and after it). The internal commands (the INTERNAL
stream's subjects and `credentials.changed`) get the same bodies straight from a publisher: each is
applied or dead-lettered as refused, never makes a handler fail, and leaves no consumer stuck.

Examples per subject: `TOOLBUS_FUZZ_EXAMPLES` (default 30; the counts are printed with `-s`)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toolbus_common.keys import Keys
from toolbus_contracts import ErrorCode, Subjects

from tests.support.commands import publish_command
from tests.support.infra import drop_deployment_state, js_name, service_process, unique_prefix

pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(900)]

EXAMPLES = int(os.environ.get("TOOLBUS_FUZZ_EXAMPLES", "30"))
CODES = {c.value for c in ErrorCode} - {"internal"}
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
    database=None,
)
"""How every test here runs its examples: a fixed sequence (derandomized, no example database),
no per-example deadline (services over NATS)."""
TS = "ts_" + "a" * 64

ODD_TEXT = st.sampled_from(
    [
        "",
        " ",
        "a b",
        "a*",
        ">",
        "a.>",
        "*",
        "\u0000",
        "\r\n",
        "😀",
        "é",
        "a" * 300,
        "a:b",
        "{x}",
        "..",
        "-",
        "_",
        "\udcff",
    ]
) | st.text(max_size=40)

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | ODD_TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(ODD_TEXT, children, max_size=4),
    max_leaves=12,
)

# A valid-looking body per subject; mutations replace, drop or add fields.
TEMPLATES: dict[str, dict[str, Any]] = {
    "runs_open": {"toolsetId": TS, "namespace": "user-1", "runId": "run_fuzz"},
    "runs_close": {"runId": "run_fuzz"},
    "calls_start": {"runId": "run_fuzz", "tool": "x.y", "input": {}, "idempotencyKey": "k"},
    "calls_invoke": {"runId": "run_fuzz", "tool": "x.y", "input": {}},
    "calls_get": {"callId": "call_0"},
    "toolsets_create": {
        "mcp": [{"name": "s", "url": "http://127.0.0.1:9/mcp"}],
        "http": {"allow": ["example.com"]},
    },
    "toolsets_get": {"id": TS},
    "toolsets_declarations": {"id": TS, "format": "prompt"},
    "toolsets_search": {"id": TS, "query": "find"},
    "workflows_publish": {"name": "wf", "inputSchema": {"type": "object"}},
    "workflows_get": {"name": "wf"},
    "approvals_list": {"runId": "run_fuzz"},
    "approvals_decide": {"approvalId": "apr_0", "approve": True},
    "toolsets_credentials_set": {"toolsetId": TS, "credentials": {"servers": {}}},
    "namespaces_credentials_set": {"namespace": "n", "toolsetId": TS, "credentials": {"servers": {}}},
    "runs_credentials_set": {"runId": "run_fuzz", "credentials": {"servers": {}}},
}


@st.composite
def mutated(draw: st.DrawFn, template: dict[str, Any]) -> bytes:
    body: Any = dict(template)
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["replace", "drop", "add", "whole"]))
        if action == "whole":
            body = draw(JSON)
        elif isinstance(body, dict) and body and action in ("replace", "drop"):
            key = draw(st.sampled_from(sorted(body)))
            if action == "drop":
                del body[key]
            else:
                body[key] = draw(JSON)
        elif isinstance(body, dict):
            body[draw(ODD_TEXT)] = draw(JSON)
    try:
        return json.dumps(body).encode()
    except (UnicodeEncodeError, ValueError):
        return json.dumps(body, ensure_ascii=True).encode("utf-8", "surrogatepass")


RAW = st.sampled_from(
    [
        b"",
        b" ",
        b"null",
        b"[]",
        b'"x"',
        b"{",
        b"\xff\xfe\x00",
        b'{"a": NaN}',
        b"[" * 10_000 + b"]" * 10_000,
        b'{"runId": "' + b"r" * 900_000 + b'"}',
        b'{"x": 1e999}',
        b'{"x": 123456789012345678901234567890}',
    ]
) | st.binary(max_size=64)


def bodies(subject: str) -> st.SearchStrategy[bytes]:
    return st.one_of(mutated(TEMPLATES[subject]), RAW)


class Loop:
    """An event loop in a thread of its own: hypothesis drives a sync test, requests run here."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 60.0) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


class Probe:
    """Sends one body, counts every reply that comes to its inbox, snapshots the deployment."""

    def __init__(self, nats_url: str, redis_url: str, prefix: str, secret_key: str) -> None:
        self.nats_url, self.redis_url, self.prefix = nats_url, redis_url, prefix
        self.secret_key = secret_key
        self.replies: Counter[str] = Counter()
        self.bodies: dict[str, bytes] = {}
        self.seq = 0
        self.sent: Counter[str] = Counter()
        self.codes: Counter[str] = Counter()

    async def open(self) -> None:
        import nats
        from redis.asyncio import Redis

        self.nc = await nats.connect(self.nats_url)
        self.redis = Redis.from_url(self.redis_url)
        self.inbox = f"_FUZZ.{self.prefix}"

        async def on_reply(msg: Any) -> None:
            self.replies[msg.subject] += 1
            self.bodies[msg.subject] = msg.data

        await self.nc.subscribe(f"{self.inbox}.*", cb=on_reply)

    async def snapshot(self) -> tuple[Any, ...]:
        # The credentials service's sweep of timed-out parked calls takes a short-lived lock on its
        # own schedule: housekeeping, not state a request changed.
        housekeeping = {Keys(self.prefix).parked_sweep_lock.encode()}
        keys = sorted(
            [
                k
                async for k in self.redis.scan_iter(match=f"{self.prefix}:*", count=1000)
                if k not in housekeeping
            ]
        )
        values: list[object] = []
        for key in keys:
            kind = (await self.redis.type(key)).decode()  # type: ignore[no-untyped-call]  # types-redis 4.6 leaves it unannotated
            if kind == "hash":
                values.append(sorted((await self.redis.hgetall(key)).items()))
            elif kind in ("zset", "set", "list", "stream"):
                values.append(kind)
            else:
                values.append(await self.redis.get(key))
        js = self.nc.jetstream()
        streams: list[tuple[str, int | None]] = []
        for name in (
            "EVENTS",
            "INTERNAL",
            "KV_" + js_name(self.prefix, "workflows"),
            "OBJ_" + js_name(self.prefix, "toolsets"),
        ):
            stream = name if name.startswith(("KV_", "OBJ_")) else js_name(self.prefix, name)
            try:
                info = await js.stream_info(stream)
                streams.append((stream, info.state.messages))
            except Exception:
                streams.append((stream, None))
        return tuple(keys), tuple(map(str, values)), tuple(streams)

    async def send(self, subject: str, body: bytes) -> dict[str, Any]:
        self.seq += 1
        reply_to = f"{self.inbox}.{self.seq}"
        before = await self.snapshot()
        await self.nc.publish(subject, body, reply=reply_to)
        for _ in range(600):  # up to 30 s for the one reply (a liveness bound)
            if self.replies[reply_to]:
                break
            await asyncio.sleep(0.05)
        assert self.replies[reply_to] >= 1, f"no reply on {subject} to {body[:200]!r}"
        reply = json.loads(self.bodies[reply_to])
        assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool), reply
        self.sent[subject] += 1
        if not reply["ok"]:
            code = reply["error"]["code"]
            self.codes[code] += 1
            assert code in CODES, (subject, body[:300], reply)
            assert isinstance(reply["error"]["message"], str) and len(reply["error"]["message"]) < 5000
            after = await self.snapshot()
            assert before == after, f"a refused request changed state: {subject} {body[:200]!r}"
        else:
            self.codes["ok"] += 1
        return reply

    async def settle(self) -> None:
        await asyncio.sleep(0.5)  # any second reply would have come by now
        await self.nc.flush()

    async def close(self) -> None:
        await drop_deployment_state(self.nc, self.redis_url, self.prefix)
        await self.nc.drain()
        await self.redis.aclose()  # type: ignore[attr-defined]  # redis>=5; stubs lag


@pytest.fixture(scope="module")
def deployment(nats_url: str, redis_url: str, secret_key: str) -> Iterator[tuple[Loop, Probe, list[Any]]]:
    prefix = unique_prefix("tbz")
    env = {
        "TOOLBUS_NATS_URL": nats_url,
        "TOOLBUS_REDIS_URL": redis_url,
        "TOOLBUS_SUBJECT_PREFIX": prefix,
        "TOOLBUS_SECRET_KEY": secret_key,
        "TOOLBUS_LOG_LEVEL": "ERROR",
    }
    loop = Loop()
    probe = Probe(nats_url, redis_url, prefix, secret_key)
    loop.run(probe.open())
    with (
        service_process("registry", env) as registry,
        service_process("dispatcher", env) as dispatcher,
        service_process("approval", env) as approval,
        service_process("credentials", env) as credentials,
    ):
        procs = [registry, dispatcher, approval, credentials]
        pids = [p.proc.pid for p in procs]
        try:
            yield loop, probe, procs
            loop.run(probe.settle())
            assert all(p.proc.poll() is None for p in procs), "a service exited"
            assert [p.proc.pid for p in procs] == pids
            twice = {s: n for s, n in probe.replies.items() if n != 1}
            assert not twice, f"requests with more than one reply: {twice}"
            print(
                f"\nfuzz: {sum(probe.sent.values())} requests, by subject {dict(probe.sent)}, replies {dict(probe.codes)}"
            )
        finally:
            loop.run(probe.close())
            loop.close()


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_every_subject_answers_bad_input_once_without_internal(
    deployment: tuple[Loop, Probe, list[Any]], name: str
) -> None:
    loop, probe, procs = deployment
    subject = getattr(Subjects(probe.prefix), name)

    @FUZZ_SETTINGS
    @given(body=bodies(name))
    def one(body: bytes) -> None:
        loop.run(probe.send(subject, body))

    one()
    assert all(p.proc.poll() is None for p in procs), [p.log() for p in procs if p.proc.poll() is not None]


@pytest.mark.parametrize("name", ["", "a b", "a*", ">", "a.>", "\u0000", "😀", "x" * 65])
def test_workflows_get_with_a_name_the_kv_store_refuses_is_invalid_request(
    deployment: tuple[Loop, Probe, list[Any]], name: str
) -> None:
    loop, probe, _ = deployment
    reply = loop.run(probe.send(Subjects(probe.prefix).workflows_get, json.dumps({"name": name}).encode()))
    assert reply["ok"] is False and reply["error"]["code"] == "invalidRequest"
    assert reply["error"]["details"]["field"] == "name"


# Internal commands (JetStream, INTERNAL stream; `credentials.changed` is plain NATS) that only
# services publish: a valid-looking body per subject, of calls, runs and approvals that do not exist.
INTERNAL_TEMPLATES: dict[str, dict[str, Any]] = {
    "internal_approval_requests": {
        "approvalId": "apr_fuzz",
        "callId": "call_fuzz",
        "runId": "run_fuzz",
        "toolsetId": TS,
        "tool": "x.y",
        "input": {},
        "inputDigest": "0" * 64,
        "requestedAt": "2026-01-01T00:00:00Z",
    },
    "internal_approval_decisions": {
        "approvalId": "apr_fuzz",
        "callId": "call_fuzz",
        "runId": "run_fuzz",
        "toolsetId": TS,
        "tool": "x.y",
        "inputDigest": "0" * 64,
        "decision": "approved",
    },
    "internal_calls_park": {
        "callId": "call_fuzz",
        "runId": "run_fuzz",
        "toolsetId": TS,
        "server": "s",
        "level": "toolset",
        "parkedAt": "2026-01-01T00:00:00Z",
    },
    "internal_calls_resume": {"callIds": ["call_fuzz"]},
    "internal_credentials_changed": {"level": "toolset", "toolsetId": TS},
    "internal_runs_closed": {"runId": "run_fuzz", "toolsetId": TS, "callIds": ["call_fuzz"]},
}


async def _dead_letter_reasons(probe: Probe) -> list[str]:
    """`Toolbus-Dead-Reason` of every dead letter the deployment kept so far."""
    js = probe.nc.jetstream()
    subject = Subjects(probe.prefix).internal_dead_letters
    info = await js.stream_info(js_name(probe.prefix, "INTERNAL"))
    reasons: list[str] = []
    if not info.state.messages:
        return reasons
    sub = await js.subscribe(subject, ordered_consumer=True, stream=js_name(probe.prefix, "INTERNAL"))
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except Exception:
                return reasons
            reasons.append((msg.headers or {}).get("Toolbus-Dead-Reason", ""))
    finally:
        await sub.unsubscribe()


async def _consumers_drained(probe: Probe, within: float) -> list[str]:
    """Wait until every durable consumer of INTERNAL has nothing pending or unacknowledged; the
    ones that still do after `within` seconds."""
    js = probe.nc.jetstream()
    stream = js_name(probe.prefix, "INTERNAL")
    busy: list[str] = []
    for _ in range(int(within / 0.25)):
        busy = [
            f"{c.name}: pending {c.num_pending}, unacked {c.num_ack_pending}"
            for c in await js.consumers_info(stream)
            if c.num_pending or c.num_ack_pending
        ]
        if not busy:
            return busy
        await asyncio.sleep(0.25)
    return busy


@pytest.mark.parametrize("name", sorted(INTERNAL_TEMPLATES))
def test_internal_commands_with_bad_bodies_are_dead_lettered_without_a_handler_failing(
    deployment: tuple[Loop, Probe, list[Any]], name: str
) -> None:
    """Generated and mutated bodies published straight into the INTERNAL stream (what a buggy or
    compromised service could send): every command is applied or dead-lettered at once as refused,
    none makes a handler fail (a handler exception is retried, then dead-lettered as `failed N
    times`: a bug), no consumer is left stuck, no service restarts, and the public subjects still
    answer afterwards."""
    loop, probe, procs = deployment
    subjects = Subjects(probe.prefix)
    subject = getattr(subjects, name)
    sent: list[bytes] = []

    @FUZZ_SETTINGS
    @given(body=st.one_of(mutated(INTERNAL_TEMPLATES[name]), RAW))
    def one(body: bytes) -> None:
        sent.append(body)
        if subject.startswith(subjects.internal_all.removesuffix(">")):
            # signed as a service would: the bodies, not the signature, are what is tried here
            loop.run(
                publish_command(probe.nc.jetstream(), subject, body, secret=probe.secret_key, timeout=10)
            )
        else:  # `credentials.changed`: plain NATS, heard by every dispatcher
            loop.run(probe.nc.publish(subject, body))

    one()
    busy = loop.run(_consumers_drained(probe, 60.0), 90)
    assert not busy, f"consumers still holding commands: {busy}"
    reasons = loop.run(_dead_letter_reasons(probe), 120)
    failed = [r for r in reasons if r.startswith("failed")]
    assert not failed, f"a handler failed on a bad command (a bug): {failed[:5]}"
    assert all(p.proc.poll() is None for p in procs), [p.log() for p in procs if p.proc.poll() is not None]
    reply = loop.run(probe.send(subjects.approvals_list, json.dumps({"runId": "run_fuzz"}).encode()))
    assert reply["ok"] is True, reply
    print(f"\nfuzz {name}: {len(sent)} commands, dead letters so far {len(reasons)}")
