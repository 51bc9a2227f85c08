"""Host tools' heartbeats and the http tool's allow-list, through a real dispatcher: a worker that
stops heartbeating is interrupted and the call goes to another worker; the http tool refuses
every host not on the list, on the first URL and on every redirect."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import pytest
import pytest_asyncio
from nats.aio.msg import Msg
from toolbus_contracts import WORKER_QUEUE

from tests.dispatcher.test_dispatcher_helpers import Harness, host_tool
from tests.support.http_servers import serve_in_thread

pytestmark = pytest.mark.integration

MAX_BODY = 4096


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def h(nats_url: str, redis_url: str) -> AsyncIterator[Harness]:
    harness = Harness(nats_url, redis_url)
    await harness.connect()
    await harness.dispatcher(http_max_body=MAX_BODY)
    try:
        yield harness
    finally:
        await harness.close()


# ---- host tools ----------------------------------------------------------------------------------


async def test_a_worker_that_stops_heartbeating_is_interrupted_and_the_call_moves_to_another(
    h: Harness,
) -> None:
    assert h.nc is not None
    nc = h.nc
    ts = await h.toolset({"host": [host_tool("ask", heartbeatTimeout="300ms")]})
    run = await h.open_run(ts)
    subject = h.subjects.host_call("ask")
    stuck_got: list[dict[str, Any]] = []
    healthy_got: list[dict[str, Any]] = []
    first_task = asyncio.Event()

    async def stuck(msg: Msg) -> None:
        # Takes the task, then freezes: no heartbeat; much later a stale result for attempt 1.
        task = json.loads(msg.data)
        stuck_got.append(task)
        await stuck_sub.unsubscribe()
        first_task.set()

        async def late() -> None:
            await asyncio.sleep(0.6)
            await nc.publish(
                h.subjects.host_result(task["callId"]), json.dumps({"attempt": 1, "output": "stale"}).encode()
            )

        asyncio.get_running_loop().create_task(late())

    async def healthy(msg: Msg) -> None:
        task = json.loads(msg.data)
        healthy_got.append(task)

        async def work() -> None:
            for _ in range(8):  # 0.8 s of work, far past the 300 ms heartbeat timeout
                await nc.publish(
                    h.subjects.host_heartbeat(task["callId"]),
                    json.dumps({"attempt": task["attempt"]}).encode(),
                )
                await asyncio.sleep(0.1)
            body = {"attempt": task["attempt"], "output": {"answer": "fresh"}}
            await nc.publish(h.subjects.host_result(task["callId"]), json.dumps(body).encode())

        asyncio.get_running_loop().create_task(work())

    stuck_sub = await nc.subscribe(subject, queue=WORKER_QUEUE, cb=stuck)
    await nc.flush()
    invoke = asyncio.create_task(h.invoke(run, "ask", {"q": "?"}, idempotencyKey="hb-1"))
    await asyncio.wait_for(first_task.wait(), 10)
    healthy_sub = await nc.subscribe(subject, queue=WORKER_QUEUE, cb=healthy)
    try:
        data = await invoke
    finally:
        await healthy_sub.unsubscribe()
    assert data["outcome"] == {"status": "ok", "output": {"answer": "fresh"}}
    assert [t["attempt"] for t in stuck_got] == [1]
    assert [t["attempt"] for t in healthy_got] == [2]
    assert stuck_got[0]["idempotencyKey"] == healthy_got[0]["idempotencyKey"] == "hb-1"
    assert healthy_got[0]["heartbeatTimeout"] == "300ms" and healthy_got[0]["runId"] == run
    assert "timeout" not in healthy_got[0]  # no timeout: none sent (an older worker refuses a task with it)
    got = await h.ok(h.subjects.calls_get, {"callId": data["callId"]})
    assert got["attempts"] == 2


@pytest.mark.parametrize(
    "result",
    [
        b"\xff\xfe",
        b"",
        b"[1]",
        b'{"output": 1}',
        b'{"attempt": "1", "output": 1}',
        b'{"attempt": 1, "output": NaN}',
    ],
)
async def test_a_result_that_is_not_one_ends_the_call_upstream_error_at_once(
    h: Harness, result: bytes
) -> None:
    """Such a result was dropped: the call waited out its heartbeats, five attempts, then ended
    `timeout` saying the worker missed its heartbeat."""
    assert h.nc is not None
    nc = h.nc
    ts = await h.toolset({"host": [host_tool("garbled", heartbeatTimeout="60s")]})
    run = await h.open_run(ts)
    tasks: list[dict[str, Any]] = []

    async def worker(msg: Msg) -> None:
        tasks.append(json.loads(msg.data))
        await msg.respond(result)

    sub = await nc.subscribe(h.subjects.host_call("garbled"), queue=WORKER_QUEUE, cb=worker)
    try:
        done = await asyncio.wait_for(h.invoke(run, "garbled", {}), 10)  # not 5 x 60 s of heartbeats
    finally:
        await sub.unsubscribe()
    assert done["outcome"]["error"]["code"] == "upstreamError", done
    assert "worker of host tool 'garbled'" in done["outcome"]["error"]["message"]
    assert len(tasks) == 1  # not sent again: the worker's bug


@pytest.mark.parametrize(
    ("error", "message"),
    [({"message": "boom"}, "boom"), ("boom", "boom"), (5, "the host tool reported an error")],
)
async def test_a_worker_error_is_tool_error_with_its_message(h: Harness, error: object, message: str) -> None:
    """`{"error": "boom"}` (a bare string, not `{"message"}`) lost its message before."""
    assert h.nc is not None
    ts = await h.toolset({"host": [host_tool("failing")]})
    run = await h.open_run(ts)

    async def worker(msg: Msg) -> None:
        await msg.respond(json.dumps({"attempt": json.loads(msg.data)["attempt"], "error": error}).encode())

    sub = await h.nc.subscribe(h.subjects.host_call("failing"), queue=WORKER_QUEUE, cb=worker)
    try:
        done = await asyncio.wait_for(h.invoke(run, "failing", {}), 10)
    finally:
        await sub.unsubscribe()
    assert done["outcome"]["error"] == {"code": "toolError", "message": message}, done


async def test_a_host_tool_nobody_serves_is_never_sent_and_retried_even_at_most_once(h: Harness) -> None:
    ts = await h.toolset({"host": [host_tool("orphan", onInterruption="at_most_once")]})
    run = await h.open_run(ts)
    data = await h.invoke(run, "orphan", {})
    assert data["outcome"]["error"]["code"] == "upstreamUnreachable"
    assert (await h.ok(h.subjects.calls_get, {"callId": data["callId"]}))["attempts"] == 5


# ---- the http tool -------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    seen: list[dict[str, Any]] = []

    def log_message(self, *args: Any) -> None:
        return None

    def _send(
        self, status: int, body: bytes, content_type: str | None, extra: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.seen.append({"path": self.path, "key": self.headers.get("Idempotency-Key")})
        port = cast("tuple[str, int]", self.server.server_address)[1]
        routes: dict[str, tuple[int, bytes, str | None, dict[str, str]]] = {
            "/text": (200, "héllo".encode(), "text/plain; charset=utf-8", {}),
            "/json": (200, b'{"a":1}', "application/json", {}),
            "/bin": (200, bytes(range(8)), "application/octet-stream", {}),
            "/big": (200, b"x" * (MAX_BODY + 1), "text/plain", {}),
            "/hop": (302, b"", None, {"Location": "/text"}),
            "/hop-local": (302, b"", None, {"Location": f"http://localhost:{port}/text"}),
            "/off": (302, b"", None, {"Location": "http://evil.example.net/steal"}),
            "/busy": (503, b"busy", "text/plain", {}),
            "/missing": (404, b"nope", "text/plain", {}),
        }
        status, body, ctype, extra = routes.get(self.path, (404, b"", None, {}))
        self._send(status, body, ctype, extra)


@pytest.fixture(scope="module")
def web() -> Iterator[str]:
    with serve_in_thread(ThreadingHTTPServer(("127.0.0.1", 0), _Handler)) as port:
        yield f"http://127.0.0.1:{port}"


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def http_run(h: Harness) -> str:
    ts = await h.toolset({"http": {"allow": ["127.0.0.1", "*.example.com"]}})
    return await h.open_run(ts)


async def fetch(h: Harness, run: str, url: str, **extra: Any) -> dict[str, Any]:
    data = await h.invoke(run, "http.fetch", {"url": url, **extra})
    outcome: dict[str, Any] = data["outcome"]
    return outcome


async def test_fetch_returns_text_bodies_as_text_and_binary_as_base64(
    h: Harness, http_run: str, web: str
) -> None:
    text = await fetch(h, http_run, f"{web}/text")
    assert text["status"] == "ok"
    out = text["output"]
    assert (out["status"], out["body"], out["bodyEncoding"]) == (200, "héllo", "text")
    assert out["headers"]["content-type"].startswith("text/plain")
    assert _Handler.seen[-1]["key"]  # the idempotency key travels as a header
    assert (await fetch(h, http_run, f"{web}/json"))["output"]["body"] == '{"a":1}'
    binary = (await fetch(h, http_run, f"{web}/bin"))["output"]
    assert (binary["body"], binary["bodyEncoding"]) == ("AAECAwQFBgc=", "base64")
    hop = (await fetch(h, http_run, f"{web}/hop"))["output"]
    assert hop["body"] == "héllo"
    missing = (await fetch(h, http_run, f"{web}/missing"))["output"]
    assert missing["status"] == 404


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://localhost:{port}/text", "localhost"),
        ("{web}/hop-local", "localhost"),
        ("{web}/off", "evil.example.net"),
        ("http://127.0.0.1@evil.host/", "evil.host"),
        ("http://example.com/", "example.com"),
        ("ftp://127.0.0.1/file", "127.0.0.1"),
    ],
)
async def test_fetch_refuses_hosts_off_the_allow_list(
    h: Harness, http_run: str, web: str, url: str, host: str
) -> None:
    port = web.rsplit(":", 1)[1]
    outcome = await fetch(h, http_run, url.format(web=web, port=port))
    assert outcome["status"] == "error"
    assert outcome["error"]["code"] == "hostNotAllowed"
    assert host in outcome["error"]["message"]


async def test_fetch_of_a_body_over_the_limit_is_output_too_large(
    h: Harness, http_run: str, web: str
) -> None:
    outcome = await fetch(h, http_run, f"{web}/big")
    assert outcome["error"]["code"] == "outputTooLarge"


async def test_a_503_is_an_interruption_retried_up_to_5_attempts(h: Harness, http_run: str, web: str) -> None:
    before = sum(1 for s in _Handler.seen if s["path"] == "/busy")
    data = await h.invoke(http_run, "http.fetch", {"url": f"{web}/busy"})
    assert data["outcome"]["error"]["code"] == "upstreamError"
    busy = [s for s in _Handler.seen if s["path"] == "/busy"][before:]
    assert len(busy) == 5 and {s["key"] for s in busy} == {data["idempotencyKey"]}


# ---- workflows -----------------------------------------------------------------------------------


async def test_workflow_calls_send_the_start_request_and_take_its_reply_as_output(h: Harness) -> None:
    assert h.nc is not None
    nc = h.nc
    ts = await h.toolset(
        {
            "workflows": [
                {"name": "triage", "version": "9f2c4e1a07b3", "inputSchema": {"type": "object"}},
                {"name": "bare", "version": "000000000001", "inputSchema": {"type": "object"}},
                {"name": "broken", "version": "000000000002", "inputSchema": {"type": "object"}},
            ]
        }
    )
    run = await h.open_run(ts)
    seen: list[dict[str, Any]] = []

    async def engine(msg: Msg) -> None:
        request = json.loads(msg.data)
        seen.append(request)
        replies = {
            "triage": {"ok": True, "data": {"label": "bug"}},
            "bare": {"label": "bare"},
            "broken": {"ok": False, "error": {"code": "internal", "message": "step 3 failed"}},
        }
        await msg.respond(json.dumps(replies[request["name"]]).encode())

    sub = await nc.subscribe(h.subjects.workflows_start("*"), cb=engine)
    try:
        triage = await h.invoke(run, "workflows.triage", {"issue": 1}, idempotencyKey="wf-1")
        bare = await h.invoke(run, "workflows.bare", {})
        broken = await h.invoke(run, "workflows.broken", {})
    finally:
        await sub.unsubscribe()
    assert triage["outcome"] == {"status": "ok", "output": {"label": "bug"}}
    assert bare["outcome"] == {"status": "ok", "output": {"label": "bare"}}
    assert broken["outcome"] == {
        "status": "error",
        "error": {"code": "toolError", "message": "step 3 failed"},
    }
    assert seen[0] == {
        "name": "triage",
        "version": "9f2c4e1a07b3",
        "input": {"issue": 1},
        "parentRunId": run,
        "callId": triage["callId"],
        "idempotencyKey": "wf-1",
    }


async def test_an_output_nested_too_deep_to_carry_is_upstream_error_and_calls_get_answers(h: Harness) -> None:
    """An output nested 252-253 levels was stored, and every `calls.get` of the call was then
    `internal` (the reply could not be written); 254 and deeper ended the call `internal`."""
    from toolbus_dispatcher.outputs import OUTPUT_DEPTH_MAX

    assert h.nc is not None
    nc = h.nc
    ts = await h.toolset({"workflows": [{"name": "deep", "version": "000000000003", "inputSchema": {}}]})
    run = await h.open_run(ts)

    async def engine(msg: Msg) -> None:
        depth = json.loads(msg.data)["input"]["depth"]
        await msg.respond(b"[" * depth + b"]" * depth)

    sub = await nc.subscribe(h.subjects.workflows_start("deep"), cb=engine)
    try:
        for depth in (OUTPUT_DEPTH_MAX, OUTPUT_DEPTH_MAX + 1, 252, 254, 400):
            done = await h.invoke(run, "workflows.deep", {"depth": depth})
            got = await h.ok(h.subjects.calls_get, {"callId": done["callId"]})
            assert got["outcome"] == done["outcome"]
            if depth <= OUTPUT_DEPTH_MAX:
                assert done["outcome"]["status"] == "ok", depth
            else:
                assert done["outcome"]["error"]["code"] == "upstreamError", (depth, done)
                assert f"{OUTPUT_DEPTH_MAX} levels" in done["outcome"]["error"]["message"]
    finally:
        await sub.unsubscribe()


async def test_an_input_too_large_for_the_task_message_is_refused_before_the_call_exists(h: Harness) -> None:
    """A host tool's task and a workflow's start request carry the input in one NATS message: an
    input near 1 MiB (or one that grows when written back, `9E15` being 9000000000000000.0) made
    the publish fail and the call end `internal`."""
    ts = await h.toolset(
        {
            "host": [host_tool("bulky")],
            "workflows": [{"name": "bulky", "version": "000000000004", "inputSchema": {"type": "object"}}],
        }
    )
    run = await h.open_run(ts)
    near = b'{"s": "' + b"x" * 1_048_300 + b'"}'
    grows = b'{"a": [' + b",".join([b"9E15"] * 150_000) + b"]}"
    for tool in ("bulky", "workflows.bulky"):
        for raw in (near, grows):
            body = b'{"runId": "%s", "tool": "%s", "input": %s}' % (run.encode(), tool.encode(), raw)
            assert h.nc is not None and len(body) < h.nc.max_payload
            reply = await h.request(h.subjects.calls_invoke, body, within=20)
            assert reply["ok"] is False and reply["error"]["code"] == "invalidRequest", (tool, reply)
            assert reply["error"]["details"]["field"] == "input", reply
            assert reply["error"]["details"]["size"] > reply["error"]["details"]["limit"]
