"""Fuzzed calls that reach execution: a real toolset (a host tool with a typed inputSchema, a free
host tool, the built-in http tool allowed to a local HTTP server, an MCP echo server over HTTP) is
registered through the registry and a run is opened; hypothesis then sends `calls.start` and
`calls.invoke` bodies with a valid envelope and a fuzzed `input` (wrong types, huge strings, odd
unicode, nesting), fuzzed `http.fetch` url/method/headers/body and a fuzzed `idempotencyKey`.

Checked: exactly one well-formed reply to each request, never `internal`; every call that was
created ends (`calls.get`) with an outcome that is not `internal`; no service restarts; no
semaphore slot, queue place or lease of the run's calls is left, nor an undelivered outbox entry.
A second test sends fuzzed `host.result` / `host.heartbeat` bodies (the dispatcher subscribes
both) while host calls are running: the dispatcher stays up and those calls end as their worker
said.

Examples: `TOOLBUS_FUZZ_CALL_EXAMPLES` (default 200; counts are printed with `-s`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from toolbus_common.keys import Keys
from toolbus_contracts import WORKER_QUEUE, ErrorCode, Subjects

from tests.support.http_servers import serve_in_thread
from tests.support.infra import drop_deployment_state, service_process, unique_prefix
from tests.support.mcp_servers import echo_server
from tests.system.test_fuzz_subjects import JSON, ODD_TEXT, Loop

pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(900)]

EXAMPLES = int(os.environ.get("TOOLBUS_FUZZ_CALL_EXAMPLES", "200"))
CODES = {c.value for c in ErrorCode} - {"internal"}
NATS_MAX = 1024 * 1024
HOST_TOOLS = ("typed", "crm.free")
TOOLS = (*HOST_TOOLS, "http.fetch", "echo.echo", "echo.plain", "echo.fail")
TYPED_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 200},
        "count": {"type": "integer", "minimum": 0, "maximum": 1000},
        "ratio": {"type": "number"},
        "flag": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 20},
        "where": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
    "required": ["name"],
    "additionalProperties": False,
}

HUGE = st.sampled_from([1_000, 100_000, 600_000, NATS_MAX - 400]).map(lambda n: "x" * n)
UNICODE = st.sampled_from(["é", "😀", "\u0000", "\r\n", "\u202e", "\ufeff", "\udcff", "ǅ", "\u00ff", "中文"])
TEXT = ODD_TEXT | UNICODE | st.text(min_size=0, max_size=200) | HUGE
VALUE = JSON | TEXT | st.recursive(JSON, lambda c: st.lists(c, max_size=3), max_leaves=60)

PATHS = st.sampled_from(
    [
        "/",
        "/ok",
        "/json",
        "/bin",
        "/big",
        "/hop",
        "/hop-bad",
        "/hop-ctl",
        "/status/404",
        "/status/500",
        "/status/503",
        "/gz-bad",
    ]
) | st.text(max_size=30).map(lambda t: "/" + t)
METHODS = st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "get", "FOO"]) | VALUE
HEADER_NAMES = (
    st.sampled_from(
        ["Accept", "Content-Type", "Host", "Idempotency-Key", "Authorization", "Accept-Encoding", "X-A", ""]
    )
    | ODD_TEXT
)
HEADER_VALUES = (
    st.sampled_from(["", "gzip", "text/plain", "a\r\nb", "\u0000", "caf\u00e9", "😀"]) | TEXT | VALUE
)


def urls(port: int) -> st.SearchStrategy[Any]:
    good = PATHS.map(lambda p: f"http://127.0.0.1:{port}{p}")
    odd = st.sampled_from(
        [
            "",
            "not a url",
            f"ftp://127.0.0.1:{port}/",
            f"http://localhost:{port}/ok",
            f"http://[::1]:{port}/ok",
            f"http://2130706433:{port}/ok",
            f"http://127.1:{port}/ok",
            f"http://user:pw@127.0.0.1:{port}/ok",
            f"http://127.0.0.1:{port}/ok#frag\u0000",
            f"http://127.0.0.1:{port}/" + "p" * 100_000,
            f"HTTP://127.0.0.1.:{port}/ok",
            "http://127.0.0.1:1/",
            "http://169.254.169.254/latest",
            "http://example.invalid/",
            f"http://127.0.0.1:{port}/ok\r\nX: y",
            f"http://127.0.0.1:{port}/%zz",
        ]
    )
    return st.one_of(good, good, good, good, odd, VALUE)


SAFE_HEADERS = st.dictionaries(
    st.sampled_from(
        ["Accept", "Content-Type", "X-A", "X-Trace", "Accept-Encoding", "Host", "Idempotency-Key"]
    ),
    st.sampled_from(["", "gzip", "text/plain", "1", "caf\u00e9", "\u00ff", "a" * 8000])
    | st.text(max_size=30),
    max_size=3,
)


def fetch_inputs(port: int) -> st.SearchStrategy[Any]:
    """Mostly inputs the schema accepts (so they run), the rest any shape."""
    valid = st.fixed_dictionaries(
        {"url": urls(port)},
        optional={
            "method": st.sampled_from(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]),
            "headers": SAFE_HEADERS,
            "body": TEXT,
        },
    )
    fuzzed = st.fixed_dictionaries(
        {"url": urls(port)},
        optional={
            "method": METHODS,
            "headers": st.dictionaries(HEADER_NAMES, HEADER_VALUES, max_size=4) | VALUE,
            "body": VALUE,
            "timeout": VALUE,
        },
    )
    return st.one_of(valid, valid, fuzzed)


TYPED_VALID = st.fixed_dictionaries(
    {"name": TEXT.filter(lambda t: len(t) <= 200)},
    optional={
        "count": st.integers(0, 1000),
        "ratio": st.floats(allow_nan=False, allow_infinity=False),
        "flag": st.booleans(),
        "tags": st.lists(TEXT, max_size=20),
        "where": st.fixed_dictionaries({}, optional={"city": TEXT}),
    },
)
TYPED_FUZZED = st.fixed_dictionaries(
    {},
    optional={
        "name": TEXT | VALUE,
        "count": st.integers(-(2**70), 2**70) | VALUE,
        "ratio": st.floats(allow_nan=False) | VALUE,
        "flag": st.booleans() | VALUE,
        "tags": st.lists(TEXT, max_size=25) | VALUE,
        "where": st.dictionaries(ODD_TEXT, VALUE, max_size=3),
        "extra": VALUE,
    },
)
TYPED_INPUTS = st.one_of(TYPED_VALID, TYPED_VALID, TYPED_FUZZED)
ECHO_INPUTS = st.one_of(
    st.fixed_dictionaries({"text": TEXT}),
    st.fixed_dictionaries({"text": TEXT}),
    st.fixed_dictionaries({}, optional={"text": TEXT | VALUE, "other": VALUE}),
)
KEYS = st.sampled_from(["a" * 250, "a" * 257, "", " ", "\u0000", "é", "😀", "a.b", "a b", "\r\n"]) | VALUE


def weighted(draw: st.DrawFn, choices: list[tuple[int, st.SearchStrategy[Any]]]) -> Any:
    """Draw from one of `choices`, picked with the given weights (hypothesis's own `one_of` picks
    evenly and, shrinking, towards the first)."""
    index = draw(st.sampled_from([i for i, (w, _) in enumerate(choices) for _ in range(w)]))
    return draw(choices[index][1])


BAD_TOOLS = ["nope", "http.get", "echo.nope", "typed.x", "", "HTTP.FETCH"]


@st.composite
def call_bodies(draw: st.DrawFn, run_id: str, port: int) -> tuple[str, bytes]:
    tool = weighted(draw, [(9, st.sampled_from(["http.fetch", *TOOLS])), (1, st.sampled_from(BAD_TOOLS))])
    if tool == "http.fetch":
        inp: Any = draw(fetch_inputs(port))
    elif tool in HOST_TOOLS:
        inp = draw(TYPED_INPUTS)
    else:
        inp = draw(ECHO_INPUTS)
    inp = weighted(draw, [(19, st.just(inp)), (1, VALUE)])  # now and then not an object at all
    body: dict[str, Any] = {"runId": run_id, "tool": tool, "input": inp}
    key = weighted(draw, [(4, st.none()), (5, st.just("k")), (1, KEYS)])
    if key is not None:
        # mostly made unique (a repeated key is the same call), sometimes left as drawn
        suffix = weighted(draw, [(4, st.integers(0, 10**9).map(str)), (1, st.just(""))])
        body["idempotencyKey"] = key + suffix if isinstance(key, str) else key
    subject = draw(st.sampled_from(["calls_invoke", "calls_start"]))
    try:
        data = json.dumps(body).encode()
    except (UnicodeEncodeError, ValueError):
        data = json.dumps(body, ensure_ascii=True).encode("utf-8", "surrogatepass")
    return subject, data


class _Web(BaseHTTPRequestHandler):
    """The http tool's target: any method; a few routes with statuses, redirects, sizes, encodings."""

    requests = 0

    def log_message(self, *args: Any) -> None:
        return None

    def _answer(self) -> None:
        type(self).requests += 1
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(min(length, 10_000_000))
        path = self.path.split("?")[0]
        extra: dict[str, str] = {}
        status, ctype, body = 200, "application/json", b'{"ok":true}'
        if path == "/bin":
            ctype, body = "application/octet-stream", bytes(range(256))
        elif path == "/big":
            ctype, body = "text/plain", b"y" * 300_000
        elif path == "/hop":
            status, body, extra = 302, b"", {"Location": "/ok"}
        elif path == "/hop-bad":
            status, body, extra = 302, b"", {"Location": "http://[::1"}
        elif path == "/hop-ctl":
            status, body, extra = 302, b"", {"Location": "/ok\x01x"}
        elif path.startswith("/status/") and path[8:].isdigit():
            status = int(path[8:])
        elif path == "/gz-bad":
            extra = {"Content-Encoding": "gzip"}
            body = b"not gzip at all"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        for k, v in extra.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _answer

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except Exception:  # an odd method name or line: the server, not the test, answers 400/501
            self.close_connection = True

    def __getattr__(self, name: str) -> Any:
        if name.startswith("do_"):
            return self._answer
        raise AttributeError(name)


@dataclass
class Sent:
    subject: str
    body: bytes
    replies: list[bytes] = field(default_factory=list)


class CallProbe:
    """Publishes requests each with a reply inbox of its own, counts replies, answers host calls."""

    def __init__(self, nats_url: str, redis_url: str, prefix: str) -> None:
        self.nats_url, self.redis_url, self.prefix = nats_url, redis_url, prefix
        self.subjects = Subjects(prefix)
        self.keys = Keys(prefix)
        self.sent: dict[str, Sent] = {}
        self.seq = 0
        self.call_ids: dict[str, str] = {}  # callId -> inbox of the request that created it
        self.codes: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.by_tool: Counter[str] = Counter()
        self.internal: list[str] = []
        self.host_tasks: Counter[str] = Counter()
        self.too_large = 0
        self.hold: dict[str, asyncio.Event] = {}  # idempotencyKey -> set when the worker may answer

    async def open(self) -> None:
        import nats

        self.nc = await nats.connect(self.nats_url, max_reconnect_attempts=-1)
        self.redis = Redis.from_url(self.redis_url)
        self.inbox = f"_FUZZC.{self.prefix}"

        async def on_reply(msg: Any) -> None:
            sent = self.sent.get(msg.subject)
            if sent is not None:
                sent.replies.append(msg.data)

        await self.nc.subscribe(f"{self.inbox}.*", cb=on_reply)
        await self.nc.subscribe(self.subjects.host_call(">"), queue=WORKER_QUEUE, cb=self._work)
        await self.nc.flush()

    async def _work(self, msg: Any) -> None:
        """A host-tool worker: answers each attempt at once with what it got (or its size)."""
        task = orjson.loads(msg.data)
        self.host_tasks[task["tool"]] += 1
        held = self.hold.get(task["idempotencyKey"])
        if held is not None:
            asyncio.get_running_loop().create_task(self._held(msg, task, held))
            return
        got: Any = task["input"] if len(msg.data) < 100_000 else {"size": len(msg.data)}
        if isinstance(got, dict) and got.get("flag") is True:
            await msg.respond(orjson.dumps({"attempt": task["attempt"], "error": {"message": "flagged"}}))
        else:
            await msg.respond(orjson.dumps({"attempt": task["attempt"], "output": {"got": got}}))

    async def _held(self, msg: Any, task: dict[str, Any], held: asyncio.Event) -> None:
        while not held.is_set():  # heartbeats until released
            await self.nc.publish(
                self.subjects.host_heartbeat(task["callId"]), orjson.dumps({"attempt": task["attempt"]})
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(held.wait(), 0.5)
        await msg.respond(orjson.dumps({"attempt": task["attempt"], "output": {"held": task["callId"]}}))

    async def publish(self, subject: str, body: bytes) -> str:
        self.seq += 1
        reply_to = f"{self.inbox}.{self.seq}"
        if len(body) + 1024 > self.nc.max_payload:
            self.too_large += 1  # the client refuses it before NATS sees it
            return reply_to
        self.sent[reply_to] = Sent(subject, body)
        await self.nc.publish(subject, body, reply=reply_to)
        # A bounded number in flight: calls.invoke replies only when its call is done.
        for _ in range(2400):
            if sum(1 for s in self.sent.values() if not s.replies) < 24:
                break
            await asyncio.sleep(0.05)
        return reply_to

    def check_reply(self, reply_to: str) -> None:
        sent = self.sent[reply_to]
        what = f"{sent.subject} {sent.body[:300]!r}"
        assert len(sent.replies) == 1, f"{len(sent.replies)} replies to {what}"
        reply = json.loads(sent.replies[0])
        assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool), (what, reply)
        if not reply["ok"]:
            code = reply["error"]["code"]
            self.codes[code] += 1
            assert isinstance(reply["error"]["message"], str) and len(reply["error"]["message"]) < 5000
            if code not in CODES:
                self.internal.append(f"reply {code}: {what} -> {str(reply)[:400]}")
            return
        data = reply["data"]
        self.codes["ok"] += 1
        assert isinstance(data.get("callId"), str) and isinstance(data.get("idempotencyKey"), str), (
            what,
            data,
        )
        self.call_ids.setdefault(data["callId"], reply_to)
        if sent.subject.endswith("calls.invoke"):
            outcome = data.get("outcome")
            assert isinstance(outcome, dict) and outcome.get("status") in ("ok", "error"), (what, data)

    async def wait_replies(self, limit: float) -> None:
        for _ in range(int(limit / 0.2)):  # replies come from the NATS callback: polled, bounded
            if all(s.replies for s in self.sent.values()):
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # any second reply would have come by now
        await self.nc.flush()
        missing = [f"{s.subject} {s.body[:200]!r}" for s in self.sent.values() if not s.replies]
        assert not missing, f"{len(missing)} requests without a reply, e.g. {missing[:3]}"

    async def get(self, call_id: str) -> dict[str, Any]:
        msg = await self.nc.request(self.subjects.calls_get, orjson.dumps({"callId": call_id}), timeout=30)
        reply: dict[str, Any] = orjson.loads(msg.data)
        assert reply["ok"], reply
        data: dict[str, Any] = reply["data"]
        return data

    async def wait_outcomes(self, call_ids: list[str], limit: float) -> dict[str, dict[str, Any]]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        done: dict[str, dict[str, Any]] = {}
        while True:
            for call_id in [c for c in call_ids if c not in done]:
                got = await self.get(call_id)
                if got["state"] == "done":
                    done[call_id] = got
            if len(done) == len(call_ids) or loop.time() > deadline:
                break
            await asyncio.sleep(0.5)
        open_ = {c: (await self.get(c))["state"] for c in call_ids if c not in done}
        assert not open_, f"calls not done after {limit:g}s: {open_}"
        return done

    async def leftovers(self, run_ids: list[str], call_ids: list[str]) -> dict[str, int]:
        r, k = self.redis, self.keys
        left: Counter[str] = Counter()
        for run_id in run_ids:
            left["run slots"] += await r.zcard(k.run_slots(run_id))
            for tool in TOOLS:
                left["tool slots"] += await r.zcard(k.run_tool_slots(run_id, tool))
            left["queue places"] += await r.zcard(k.run_waiting(run_id))
        ids = set(call_ids)
        left["leases"] = sum(1 for m in await r.zrange(k.call_leases, 0, -1) if m.decode() in ids)
        left["outbox"] = await r.xlen(k.call_events_outbox)
        return {name: n for name, n in left.items() if n}

    async def until_no_leftovers(self, run_ids: list[str], call_ids: list[str]) -> dict[str, int]:
        left: dict[str, int] = {}
        for _ in range(60):  # the relay may still be delivering the last events
            left = await self.leftovers(run_ids, call_ids)
            if not left:
                break
            await asyncio.sleep(0.5)
        return left

    async def close(self) -> None:
        await drop_deployment_state(self.nc, self.redis_url, self.prefix)
        await self.nc.drain()
        await self.redis.aclose()  # type: ignore[attr-defined]  # redis>=5; stubs lag


@dataclass
class Deployment:
    loop: Loop
    probe: CallProbe
    procs: list[Any]
    run_id: str
    port: int


async def _request(probe: CallProbe, subject: str, body: dict[str, Any]) -> dict[str, Any]:
    msg = await probe.nc.request(subject, orjson.dumps(body), timeout=60)
    reply: dict[str, Any] = orjson.loads(msg.data)
    assert reply["ok"], reply
    data: dict[str, Any] = reply["data"]
    return data


@pytest.fixture(scope="module")
def deployment(nats_url: str, redis_url: str, secret_key: str) -> Iterator[Deployment]:
    prefix = unique_prefix("tbzc")
    env = {
        "TOOLBUS_NATS_URL": nats_url,
        "TOOLBUS_REDIS_URL": redis_url,
        "TOOLBUS_SUBJECT_PREFIX": prefix,
        "TOOLBUS_SECRET_KEY": secret_key,
        "TOOLBUS_LOG_LEVEL": "ERROR",
        # Retries of interrupted calls (a 503, a refused port) quickly: the fuzz is about answers.
        "TOOLBUS_DISPATCHER_RETRY_BACKOFF": "0.05",
        "TOOLBUS_DISPATCHER_RETRY_BACKOFF_MAX": "0.2",
    }
    loop = Loop()
    probe = CallProbe(nats_url, redis_url, prefix)
    loop.run(probe.open())
    mcp = echo_server()
    mcp.start_blocking()
    try:
        with (
            serve_in_thread(ThreadingHTTPServer(("127.0.0.1", 0), _Web)) as port,
            service_process("registry", env) as registry,
            service_process("dispatcher", env) as dispatcher,
        ):
            procs = [registry, dispatcher]
            pids = [p.proc.pid for p in procs]
            spec = {
                "mcp": [{"name": "echo", "url": mcp.url}],
                "host": [
                    {"name": "typed", "inputSchema": TYPED_SCHEMA, "policy": {"heartbeatTimeout": "10s"}},
                    {
                        "name": "crm.free",
                        "inputSchema": {"type": "object"},
                        "policy": {"heartbeatTimeout": "10s"},
                    },
                ],
                "http": {"allow": ["127.0.0.1"], "policy": {"timeout": "20s"}},
            }
            toolset = loop.run(_request(probe, probe.subjects.toolsets_create, spec), 120)
            run = loop.run(
                _request(probe, probe.subjects.runs_open, {"toolsetId": toolset["id"], "namespace": "fuzz"})
            )
            try:
                yield Deployment(loop, probe, procs, run["runId"], port)
                assert all(p.proc.poll() is None for p in procs), [
                    p.log() for p in procs if p.proc.poll() is not None
                ]
                assert [p.proc.pid for p in procs] == pids
            finally:
                loop.run(probe.close())
    finally:
        mcp.stop_blocking()
        loop.close()


def test_fuzzed_calls_run_and_end_without_internal(deployment: Deployment) -> None:
    d = deployment
    probe, loop = d.probe, d.loop
    subjects = probe.subjects

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(req=call_bodies(d.run_id, d.port))
    def one(req: tuple[str, bytes]) -> None:
        name, body = req
        loop.run(probe.publish(getattr(subjects, name), body), 180)

    one()
    loop.run(probe.wait_replies(300), 330)
    for reply_to in list(probe.sent):
        probe.check_reply(reply_to)
    call_ids = sorted(probe.call_ids)
    done = loop.run(probe.wait_outcomes(call_ids, 300), 400)
    for call_id, got in done.items():
        outcome = got["outcome"]
        assert isinstance(outcome, dict) and outcome.get("status") in ("ok", "error"), got
        code = outcome.get("error", {}).get("code") if outcome["status"] == "error" else "ok"
        probe.outcomes[str(code)] += 1
        probe.by_tool[f"{orjson.loads(probe.sent[probe.call_ids[call_id]].body).get('tool')}:{code}"] += 1
        if code not in CODES | {"ok"}:
            sent = probe.sent[probe.call_ids[call_id]]
            line = f"outcome {code}: {sent.subject} {sent.body[:300]!r} -> {str(outcome)[:400]}"
            probe.internal.append(line)
    left = loop.run(probe.until_no_leftovers([d.run_id], call_ids), 60)
    print(
        f"\nfuzz calls: {len(probe.sent)} requests, replies {dict(probe.codes)}, {len(call_ids)} calls, "
        f"outcomes {dict(probe.outcomes)} ({dict(sorted(probe.by_tool.items()))}), host attempts {dict(probe.host_tasks)}, "
        f"http requests served {_Web.requests}, too large to send {probe.too_large}, internal {len(probe.internal)}"
    )
    assert not probe.internal, "internal answers:\n" + "\n".join(probe.internal)
    assert not left, f"left in Redis: {left}"
    assert all(p.proc.poll() is None for p in d.procs), [
        p.log() for p in d.procs if p.proc.poll() is not None
    ]


def _a_stale_result(body: Any) -> bool:
    """A well-formed result of an attempt other than the running one (attempt 1): dropped."""
    return isinstance(body, dict) and type(body.get("attempt")) is int and body["attempt"] != 1


def _not_the_running_attempt(body: Any) -> bool:
    return not (isinstance(body, dict) and body.get("attempt") == 1)  # True and 1.0 too


HOST_BODIES = st.one_of(
    JSON.filter(_not_the_running_attempt),
    st.fixed_dictionaries(
        {"attempt": JSON.filter(lambda a: a != 1)},  # never the running attempt: must be dropped
        optional={"output": JSON, "error": JSON},
    ),
    st.binary(max_size=64),
    st.sampled_from([b"", b"null", b"{", b"\xff", b"[" * 5000 + b"]" * 5000]),
)


def test_fuzzed_host_results_and_heartbeats_change_no_other_call(deployment: Deployment) -> None:
    d = deployment
    probe, loop = d.probe, d.loop
    subjects = probe.subjects

    async def start_held(n: int) -> list[str]:
        ids = []
        for i in range(n):
            key = f"held-{i}"
            probe.hold[key] = asyncio.Event()
            msg = await probe.nc.request(
                subjects.calls_start,
                orjson.dumps(
                    {"runId": d.run_id, "tool": "crm.free", "input": {"i": i}, "idempotencyKey": key}
                ),
                timeout=60,
            )
            ids.append(orjson.loads(msg.data)["data"]["callId"])
        return ids

    held = loop.run(start_held(4))
    sent: Counter[str] = Counter()

    @settings(
        max_examples=max(EXAMPLES // 2, 10),
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(
        kind=st.sampled_from(["result", "heartbeat"]),
        target=st.sampled_from([*held, "call_nope", "x", "-", "\u00e9"])
        | st.text(alphabet="abc_-0123456789", min_size=1, max_size=30),
        body=HOST_BODIES,
    )
    def one(kind: str, target: str, body: Any) -> None:
        if kind == "result" and target in held and not _a_stale_result(body):
            # a well-formed result of the running attempt is one, even on the bare subject (where
            # anything else is dropped): sent where no call waits
            target = "call_nope"
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        subject = subjects.host_result(target) if kind == "result" else subjects.host_heartbeat(target)
        loop.run(probe.nc.publish(subject, data))
        sent[kind] += 1

    one()

    async def finish() -> dict[str, dict[str, Any]]:
        await probe.nc.flush()
        await asyncio.sleep(0.5)
        for call_id in held:
            got = await probe.get(call_id)
            assert got["state"] == "running" and got["attempts"] == 1, got  # nothing ended or moved them
        for event in probe.hold.values():
            event.set()
        return await probe.wait_outcomes(held, 120)

    done = loop.run(finish(), 180)
    print(f"\nfuzz host bodies: {dict(sent)}")
    for call_id, got in done.items():
        assert got["outcome"] == {"status": "ok", "output": {"held": call_id}}, got
        assert got["attempts"] == 1, got
    assert all(p.proc.poll() is None for p in d.procs), [
        p.log() for p in d.procs if p.proc.poll() is not None
    ]
    assert not loop.run(probe.until_no_leftovers([d.run_id], held), 60)
