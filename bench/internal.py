"""How fast internal commands are applied: an approval decision, a resume after new credentials and
a run's close, each measured from the request that causes it, beside a bare NATS request/reply
measured in the same run.

Starts the dispatcher, approval and credentials services as processes on a fresh prefix of the
local NATS and Redis, and two MCP test servers in this process (one open, with an `approval: true`
policy on `echo`; one behind a bearer token that the bench rotates to make calls park). The tools
answer at once, so what is measured is the command's path, not the tool:

- decision: `approvals.decide` sent → the call's `approved` event: its own `at` (when the
  dispatcher applied the decision; wall clock, 1 ms resolution) and its arrival (events linger
  up to 5 ms in the dispatcher, or until the call completes, so arrival includes the tool);
- resume: `toolsets.credentials.set` sent (a call parked on a 401, its `credentials.expired`
  notice received) → the call's `resumed` event, applied (`at`) and received;
- run close: `runs.close` sent → the run's pending approval gone from `approvals.list`
  (polled every 0.5 ms; the approval service applied `RunClosed`).

Bounded loops; cleans up its streams and keys; stops by itself.

    uv run python bench/internal.py [--samples 60]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import nats
import orjson
from cryptography.fernet import Fernet
from toolbus_common.canonical import content_id
from toolbus_common.toolsets import ToolsetStore
from toolbus_contracts import PinnedToolset, Subjects

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import percentile
from tests.support.infra import drop_deployment_state, js_name, start_service, stop_process, unique_prefix
from tests.support.mcp_servers import McpTestServer, echo_tools

NATS_URL = os.environ.get("TOOLBUS_NATS_URL", "nats://127.0.0.1:4222")
REDIS_URL = os.environ.get("TOOLBUS_REDIS_URL", "redis://127.0.0.1:6379/0")


class Events:
    """Every call event of the bench's runs, as it arrives (core NATS), with its arrival time;
    `stamped` keeps each event's own `at` (when the dispatcher applied the change; wall clock, ms)."""

    def __init__(self) -> None:
        self.waiters: dict[tuple[str, str], asyncio.Future[float]] = {}
        self.stamped: dict[tuple[str, str], float] = {}

    def expect(self, call_id: str, kind: str) -> asyncio.Future[float]:
        fut = self.waiters.get((call_id, kind))
        if fut is None:
            fut = self.waiters[(call_id, kind)] = asyncio.get_running_loop().create_future()
        return fut

    async def on_event(self, msg: Any) -> None:
        at = time.perf_counter()
        event = orjson.loads(msg.data)
        self.stamped[(event["callId"], event["type"])] = datetime.fromisoformat(event["at"]).timestamp()
        fut = self.expect(event["callId"], event["type"])
        if not fut.done():
            fut.set_result(at)


async def ask(nc: Any, subject: str, body: dict[str, Any], within: float = 10.0) -> dict[str, Any]:
    reply = orjson.loads((await nc.request(subject, orjson.dumps(body), timeout=within)).data)
    if not reply["ok"]:
        raise RuntimeError(f"{subject}: {reply['error']}")
    data: dict[str, Any] = reply["data"]
    return data


def row(name: str, values: list[float]) -> str:
    ms = [v * 1e3 for v in values]
    return f"{name:<52}{len(ms):>5}{percentile(ms, 0.5):>9.2f}{percentile(ms, 0.99):>9.2f}{max(ms):>9.2f}"


async def main(samples: int) -> None:
    prefix = unique_prefix("tbbench")
    subjects = Subjects(prefix)
    env = {
        "TOOLBUS_NATS_URL": NATS_URL,
        "TOOLBUS_REDIS_URL": REDIS_URL,
        "TOOLBUS_SUBJECT_PREFIX": prefix,
        "TOOLBUS_LOG_LEVEL": "WARNING",
        "TOOLBUS_SECRET_KEY": Fernet.generate_key().decode(),
        "TOOLBUS_PARK_NOTIFY_DELAY": "50ms",
    }
    token = "tok-" + secrets.token_hex(8)
    services = []
    nc = await nats.connect(NATS_URL)
    async with (
        McpTestServer(name="open") as open_server,
        McpTestServer(name="crm", required_token=token) as crm,
    ):
        try:
            for name in ("dispatcher", "approval", "credentials"):
                services.append(start_service(name, env))
            tools = [t for t in echo_tools() if t["name"] == "echo"]
            pinned = PinnedToolset.model_validate(
                {
                    "servers": [
                        {
                            "name": "appr",
                            "url": open_server.url,
                            "tools": tools,
                            "policies": {"echo": {"approval": True}},
                        },
                        {"name": "crm", "url": crm.url, "tools": tools},
                    ]
                }
            )
            ts = content_id("ts_", pinned.model_dump(mode="json", exclude_none=True))
            store = ToolsetStore(nc.jetstream(), js_name(prefix, "toolsets"))
            await store.open()
            await store.put(ts, pinned)

            events = Events()
            await nc.subscribe(f"{prefix}.events.calls.>", cb=events.on_event)
            approvals: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

            async def on_requested(msg: Any) -> None:
                await approvals.put(orjson.loads(msg.data))

            await nc.subscribe(subjects.approvals_requested, cb=on_requested)
            expired: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

            async def on_expired(msg: Any) -> None:
                await expired.put(orjson.loads(msg.data))

            await nc.subscribe(subjects.credentials_expired, cb=on_expired)
            responder = await nats.connect(NATS_URL)

            async def echo(msg: Any) -> None:
                await msg.respond(msg.data)

            await responder.subscribe(f"{prefix}.bench.echo", cb=echo)
            await responder.flush()

            async def set_token(value: str) -> float:
                t0 = time.perf_counter()
                body = {
                    "toolsetId": ts,
                    "credentials": {"servers": {"crm": {"headers": {"Authorization": f"Bearer {value}"}}}},
                }
                await ask(nc, subjects.toolsets_credentials_set, body)
                return t0

            await set_token(token)
            run_id = (await ask(nc, subjects.runs_open, {"toolsetId": ts}))["runId"]

            # warm-up: one call of each kind
            done = await ask(
                nc, subjects.calls_invoke, {"runId": run_id, "tool": "crm.echo", "input": {"text": "x"}}
            )
            assert done["outcome"]["status"] == "ok", done

            bare: list[float] = []
            for _ in range(max(500, samples)):
                t0 = time.perf_counter()
                await nc.request(f"{prefix}.bench.echo", b"{}", timeout=5)
                bare.append(time.perf_counter() - t0)

            decide: list[float] = []
            decide_applied: list[float] = []
            for _ in range(samples + 5):
                started = await ask(
                    nc, subjects.calls_start, {"runId": run_id, "tool": "appr.echo", "input": {"text": "a"}}
                )
                cid = started["callId"]
                requested = await asyncio.wait_for(approvals.get(), 10)
                assert requested["callId"] == cid
                approved = events.expect(cid, "approved")
                completed = events.expect(cid, "completed")
                wall, t0 = time.time(), time.perf_counter()
                await ask(
                    nc, subjects.approvals_decide, {"approvalId": requested["approvalId"], "approve": True}
                )
                decide.append(await asyncio.wait_for(approved, 10) - t0)
                decide_applied.append(max(0.0, events.stamped[(cid, "approved")] - wall))
                await asyncio.wait_for(completed, 10)
            decide, decide_applied = decide[5:], decide_applied[5:]

            resume: list[float] = []
            resume_applied: list[float] = []
            for i in range(samples + 5):
                token = f"tok-{i}-" + secrets.token_hex(8)
                crm.required_token = token  # the stored one is now stale: the next call parks
                started = await ask(
                    nc, subjects.calls_start, {"runId": run_id, "tool": "crm.echo", "input": {"text": "r"}}
                )
                cid = started["callId"]
                await asyncio.wait_for(events.expect(cid, "parked"), 10)
                notice = await asyncio.wait_for(expired.get(), 10)  # the park is registered
                assert cid in notice["data"]["callIds"], notice
                resumed = events.expect(cid, "resumed")
                completed = events.expect(cid, "completed")
                wall = time.time()
                t0 = await set_token(token)
                resume.append(await asyncio.wait_for(resumed, 10) - t0)
                resume_applied.append(max(0.0, events.stamped[(cid, "resumed")] - wall))
                await asyncio.wait_for(completed, 10)
            resume, resume_applied = resume[5:], resume_applied[5:]

            close: list[float] = []
            close_reply: list[float] = []
            for _ in range(samples + 5):
                rid = (await ask(nc, subjects.runs_open, {"toolsetId": ts}))["runId"]
                await ask(
                    nc, subjects.calls_start, {"runId": rid, "tool": "appr.echo", "input": {"text": "c"}}
                )
                await asyncio.wait_for(approvals.get(), 10)
                t0 = time.perf_counter()
                await ask(nc, subjects.runs_close, {"runId": rid})
                close_reply.append(time.perf_counter() - t0)
                for _ in range(20_000):  # bounded: 10 s of polling at most
                    pending = await ask(nc, subjects.approvals_list, {"runId": rid})
                    if not pending["approvals"]:
                        break
                    await asyncio.sleep(0.0005)
                else:
                    raise RuntimeError("RunClosed was not applied within 10 s")
                close.append(time.perf_counter() - t0)
            close, close_reply = close[5:], close_reply[5:]
            await responder.close()

            print(f"\n{samples} samples each (after 5 warm-up), tools answer at once; ms")
            print(f"{'what':<52}{'n':>5}{'p50':>9}{'p99':>9}{'max':>9}")
            print(row("baseline: bare NATS request/reply (nats-py)", bare))
            print(row("approvals.decide -> decision applied (event `at`)", decide_applied))
            print(row("approvals.decide -> `approved` event received", decide))
            print(row("credentials.set -> resume applied (event `at`)", resume_applied))
            print(row("credentials.set -> `resumed` event received", resume))
            print(row("runs.close -> its reply (the request alone)", close_reply))
            print(row("runs.close -> approval cancelled (RunClosed applied)", close))
        finally:
            for service in services:
                stop_process(service.proc)
            with contextlib.suppress(Exception):
                await drop_deployment_state(nc, REDIS_URL, prefix)
            await nc.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=60)
    args = parser.parse_args()
    asyncio.run(main(args.samples))
