"""The trust boundary of the secured configuration, tried as an attacker holding one client
role's credentials would: nats-server checks a client's own publishes against its permissions,
but sends the answer to a request (JetStream's, or a service's) to whatever reply subject the
requester names. Here each client role aims such answers at every internal, event, store and
bucket subject of the deployment: no stream or store grows, so nothing can be applied."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from toolbus_common.connections import ensure_kv, ensure_object_store, ensure_stream
from toolbus_nats_connect import NatsAuth

from tests.system.security.conftest import SecuredNats

pytestmark = pytest.mark.integration

P = "toolbus"
CLIENT_ROLES = ("harness", "worker", "approver", "workflow-engine")
FORGED_DECISION = json.dumps(
    {
        "approvalId": "apr_forged",
        "callId": "call_victim",
        "runId": "run_victim",
        "toolsetId": "ts_" + "0" * 64,
        "tool": "bank.refund",
        "inputDigest": "0" * 64,
        "decision": "approved",
    }
).encode()

TARGETS = (
    f"{P}.internal.approvals.decided",
    f"{P}.internal.approvals.needed",
    f"{P}.internal.calls.resume",
    f"{P}.internal.calls.park",
    f"{P}.internal.runs.closed",
    f"{P}.events.calls.run_victim.call_victim",
    f"{P}.events.approvals.requested",
    f"$O.{P}_toolsets.M.dHNfdmljdGlt",
    f"$O.{P}_toolsets.C.victim",
    f"$O.{P}_outputs.M.b3V0",
    f"$KV.{P}_workflows.refund",
    f"$KV.{P}_embeddings.x",
)
"""Reply subjects an attacker would aim answers at: every subject a stream or store captures."""

STORES = (f"{P}_INTERNAL", f"{P}_EVENTS", f"OBJ_{P}_toolsets", f"OBJ_{P}_outputs", f"KV_{P}_workflows")


@asynccontextmanager
async def connect_as(secured: SecuredNats, role: str) -> AsyncIterator[Client]:
    async def quiet(exc: Exception) -> None:  # refusals are expected here; counts are the oracle
        pass

    options = NatsAuth.from_env(secured.env(role)).connect_options()
    nc = await nats.connect(**options, error_cb=quiet, allow_reconnect=False, connect_timeout=5)
    try:
        yield nc
    finally:
        await nc.close()


async def _counts(djs: Any, rjs: Any) -> dict[str, int]:
    """Messages in every stream and store, each asked by a service user that may read it."""
    return {
        name: (await (rjs if name.startswith("KV_") else djs).stream_info(name)).state.messages
        for name in STORES
    }


async def _requests(nc: Client, chunk_seq: int) -> list[tuple[str, bytes]]:
    """JetStream API requests any client might send (most refused by its permissions, the rest
    answered by the server): info, names, direct gets of chosen stored bytes, consumer creation
    that delivers onto a target."""
    out: list[tuple[str, bytes]] = [
        ("$JS.API.INFO", b""),
        ("$JS.API.STREAM.NAMES", b"{}"),
        (f"$JS.API.STREAM.INFO.{P}_INTERNAL", b""),
        (f"$JS.API.DIRECT.GET.OBJ_{P}_outputs", json.dumps({"seq": chunk_seq}).encode()),
        (f"$JS.API.DIRECT.GET.{P}_EVENTS", json.dumps({"seq": 1}).encode()),
        (f"$JS.API.STREAM.MSG.GET.OBJ_{P}_outputs", json.dumps({"seq": chunk_seq}).encode()),
    ]
    for target in TARGETS:
        config = {"stream_name": f"{P}_EVENTS", "config": {"deliver_subject": target, "ack_policy": "none"}}
        out.append((f"$JS.API.CONSUMER.CREATE.{P}_EVENTS", json.dumps(config).encode()))
    return out


async def test_no_answer_a_client_asks_for_lands_in_a_stream_or_store(secured_nats: SecuredNats) -> None:
    async with (
        connect_as(secured_nats, "dispatcher") as dispatcher,
        connect_as(secured_nats, "registry") as registry,
        connect_as(secured_nats, "approval") as approval,
    ):
        djs = dispatcher.jetstream(timeout=3)
        await ensure_stream(djs, f"{P}_EVENTS", [f"{P}.events.>"], allow_direct=True)
        await ensure_stream(djs, f"{P}_INTERNAL", [f"{P}.internal.>"])
        await djs.publish(f"{P}.events.calls.run1.call1", FORGED_DECISION)
        # Bytes an attacker chose, stored as a call's output (a tool it registered itself).
        outputs = await ensure_object_store(djs, f"{P}_outputs")
        await outputs.put("out", FORGED_DECISION)
        chunk = await djs.get_last_msg(f"OBJ_{P}_outputs", f"$O.{P}_outputs.C.>")
        rjs = registry.jetstream(timeout=3)
        await ensure_object_store(rjs, f"{P}_toolsets")
        await ensure_kv(rjs, f"{P}_workflows")

        # A service that answers whatever it is asked with those bytes (as `calls.get` could
        # carry an output): its answers must reach the asker only.
        async def answer(msg: Any) -> None:
            await msg.respond(FORGED_DECISION)

        for subject in (f"{P}.calls.get", f"{P}.approvals.list", f"{P}.host.heartbeat.c1.t"):
            await approval.subscribe(subject, cb=answer)
        await approval.flush()
        before = await _counts(djs, rjs)

        sent = 0
        for role in CLIENT_ROLES:
            async with connect_as(secured_nats, role) as client:
                for subject, body in await _requests(client, int(chunk.seq or 0)):
                    for target in TARGETS:
                        await client.publish(subject, body, reply=target)
                        sent += 1
                for subject in (f"{P}.calls.get", f"{P}.approvals.list", f"{P}.host.heartbeat.c1.t"):
                    for target in TARGETS:
                        await client.publish(subject, b"{}", reply=target)
                        sent += 1
                await client.flush()
        await asyncio.sleep(0.5)
        after = await _counts(djs, rjs)
    assert sent > 1000
    assert after == before, f"grew: { {k: after[k] - before[k] for k in after if after[k] != before[k]} }"


async def test_the_harness_reads_what_it_may_and_its_answers_come_back_to_it(
    secured_nats: SecuredNats,
) -> None:
    """The same direct get, asked for properly, is answered to the harness's own inbox (through
    its account's import): the boundary costs the reader nothing."""
    async with (
        connect_as(secured_nats, "dispatcher") as dispatcher,
        connect_as(secured_nats, "harness") as harness,
    ):
        djs = dispatcher.jetstream(timeout=3)
        await ensure_stream(djs, f"{P}_EVENTS", [f"{P}.events.>"], allow_direct=True)
        ack = await djs.publish(f"{P}.events.calls.run2.call2", b'{"type": "accepted"}')
        reply = await harness.request(
            f"$JS.API.DIRECT.GET.{P}_EVENTS", json.dumps({"seq": ack.seq}).encode(), timeout=5
        )
        assert reply.data == b'{"type": "accepted"}'
        assert reply.headers is not None and reply.headers["Nats-Subject"] == f"{P}.events.calls.run2.call2"
