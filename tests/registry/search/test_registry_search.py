"""`toolsets.search` through the registry against real NATS (JetStream) and a real MCP server:
vectors are computed once and then persisted in the JetStream KV bucket, so a registry restart
and a second replica embed nothing again (counted) and rank exactly as the registry that
embedded (same order, same scores), and a search that arrives while a toolset is still being
embedded answers at once from the lexical ranking."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import pytest_asyncio
from toolbus_common import Settings
from toolbus_contracts import Subjects, ToolInfo, ToolsetSearchRequest
from toolbus_registry import searching
from toolbus_registry.app import RegistryApp
from toolbus_registry.search import Encoder, PreparedTerms, SearchIndex, default_encoder
from toolbus_registry.search.encoder import Vectors

from tests.support.infra import request, until
from tests.support.mcp_servers import McpTestServer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

TASKS = {
    "send_invoice": "Email an invoice to a customer for an order",
    "refund_payment": "Give a customer their money back for a charge",
    "list_subscriptions": "Show the recurring plans a customer pays for",
    "cancel_subscription": "Stop a recurring plan at the end of the period",
    "create_coupon": "Make a discount code for a percentage or an amount off",
    "get_balance": "How much money the account holds and what is pending",
    "create_payout": "Send funds from the balance to a bank account",
    "list_disputes": "Chargebacks customers opened with their bank",
}


def tools(tag: str) -> list[dict[str, Any]]:
    """Tools whose texts are unique to `tag`, so no other test (or run) has embedded them."""
    return [
        {"name": name, "description": f"{text} ({tag}).", "inputSchema": {"type": "object"}}
        for name, text in TASKS.items()
    ]


@pytest.fixture(scope="module")
def settings(service_env: dict[str, str]) -> Settings:
    env: dict[str, Any] = {k.removeprefix("TOOLBUS_").lower(): v for k, v in service_env.items()}
    return Settings(**env)


@pytest.fixture(scope="module")
def subjects(settings: Settings) -> Subjects:
    return settings.subjects


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def billing(prefix: str) -> AsyncIterator[McpTestServer]:
    server = McpTestServer(tools(f"persisted {prefix}"), name="billing")
    await server.start()
    yield server
    await server.stop()


async def started(settings: Settings) -> RegistryApp:
    app = RegistryApp(settings, credentials=_NoCredentials())
    await app.start()
    return app


class _NoCredentials:
    async def set_toolset(self, toolset_id: str, credentials: Any) -> None:  # pragma: no cover
        raise AssertionError("these toolsets carry no credentials")


def searcher_of(app: RegistryApp) -> searching.Searcher:
    assert app.service is not None
    return app.service.searcher


async def register(nc: Any, subjects: Subjects, server: McpTestServer) -> str:
    reply = await request(
        nc, subjects.toolsets_create, {"mcp": [{"name": "billing", "url": server.url}]}, timeout=20
    )
    assert reply["ok"], reply
    toolset_id: str = reply["data"]["id"]
    return toolset_id


QUERIES = ("give the money back", "discount", "chargebacks from banks", "pay out to my bank", "invoice")
"""Searches whose whole ranking (every tool, with its score) must not depend on the replica."""


async def rankings(app: RegistryApp, toolset_id: str) -> list[list[tuple[str, float]]]:
    """Each of `QUERIES`' hits on `app`, every tool of the toolset, as (name, score)."""
    assert app.service is not None
    out = []
    for query in QUERIES:
        reply = await app.service.search(ToolsetSearchRequest(id=toolset_id, query=query, limit=len(TASKS)))
        out.append([(hit.name, hit.score) for hit in reply.tools])
    return out


async def test_vectors_persist_across_a_restart_and_are_shared_by_a_replica(
    nc: Any, subjects: Subjects, settings: Settings, billing: McpTestServer
) -> None:
    first = await started(settings)
    try:
        toolset_id = await register(nc, subjects, billing)
        await until(lambda: searcher_of(first).dense(toolset_id), "first registry embedded", 60)
        # Two texts a tool: its text and its name's words (`SearchIndex.embedding_texts`).
        assert searcher_of(first).embedder.encoded == 2 * len(TASKS)
        # The registry that embedded ranks with the vectors the store holds (float16), so the
        # replica and the restarted registry below give the same order and the same scores.
        embedded = await rankings(first, toolset_id)
        assert all(len(hits) == len(TASKS) for hits in embedded)
        reply = await request(
            nc, subjects.toolsets_search, {"id": toolset_id, "query": "give the money back", "limit": 3}
        )
        assert reply["ok"] and reply["data"]["tools"][0]["name"] == "billing.refund_payment", reply

        # A second replica: it searches the toolset, loads every vector from the KV bucket.
        replica = await started(settings)
        try:
            assert replica.service is not None
            await replica.service.search(ToolsetSearchRequest(id=toolset_id, query="discount", limit=3))
            await until(lambda: searcher_of(replica).dense(toolset_id), "replica loaded vectors", 30)
            assert searcher_of(replica).embedder.encoded == 0
            assert searcher_of(replica).embedder.loaded == 2 * len(TASKS)
            hits = await replica.service.search(
                ToolsetSearchRequest(id=toolset_id, query="chargebacks from banks", limit=1)
            )
            assert hits.tools[0].name == "billing.list_disputes"
            assert await rankings(replica, toolset_id) == embedded
        finally:
            await replica.stop()
    finally:
        await first.stop()

    # A restart: the same toolset registered again embeds nothing.
    again = await started(settings)
    try:
        assert await register(nc, subjects, billing) == toolset_id
        await until(lambda: searcher_of(again).dense(toolset_id), "restarted registry loaded vectors", 30)
        assert searcher_of(again).embedder.encoded == 0
        assert searcher_of(again).embedder.loaded == 2 * len(TASKS)
        assert await rankings(again, toolset_id) == embedded
    finally:
        await again.stop()


class GatedEncoder(Encoder):
    """The real encoder, holding every batch of tool texts the background embedding encodes
    until `gate` is set (queries, and a search's own head, pass)."""

    def __init__(self, inner: Encoder, gate: threading.Event) -> None:
        self.__dict__.update(inner.__dict__)
        self.gate = gate
        self.held = threading.Event()

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> Vectors:
        if threading.current_thread().name.startswith("toolbus-embed"):
            self.held.set()
            assert self.gate.wait(60), "the test never opened the gate"
        return super().encode(texts, batch_size)


async def test_a_search_during_background_embedding_embeds_its_head_and_answers_at_once(
    nc: Any, subjects: Subjects, settings: Settings, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The background embedding is held; a search embeds the tools of its lexical head itself
    # (not behind that queue) and ranks with them: `ranking: partial`, the state in toolsets.get.
    gate = threading.Event()
    gated = GatedEncoder(default_encoder(), gate)
    monkeypatch.setattr(searching, "default_encoder", lambda: gated)
    monkeypatch.setattr(searching, "ON_DEMAND_WAIT", 60.0)  # however busy the machine
    server = McpTestServer(tools(f"gated {prefix}"), name="billing")
    await server.start()
    app = await started(settings)
    try:
        toolset_id = await register(nc, subjects, server)
        await until(gated.held.is_set, "embedding started", 30)
        assert searcher_of(app).embedding(toolset_id)
        reply = await request(
            nc, subjects.toolsets_search, {"id": toolset_id, "query": "refund a payment", "limit": 3}
        )
        assert reply["ok"], reply
        assert reply["data"]["tools"][0]["name"] == "billing.refund_payment"
        assert reply["data"]["ranking"] == "partial"
        assert searcher_of(app).embedding(toolset_id) and not searcher_of(app).dense(toolset_id)
        state = await request(nc, subjects.toolsets_get, {"id": toolset_id})
        ready = state["data"]["vectors"]
        assert 1 <= ready["ready"] < ready["tools"] == len(TASKS), ready
        gate.set()
        await until(lambda: searcher_of(app).dense(toolset_id), "embedding finished", 60)
        reply = await request(
            nc, subjects.toolsets_search, {"id": toolset_id, "query": "money back", "limit": 1}
        )
        assert reply["data"]["tools"][0]["name"] == "billing.refund_payment", reply
        assert reply["data"]["ranking"] == "hybrid"
        state = await request(nc, subjects.toolsets_get, {"id": toolset_id})
        assert state["data"]["vectors"] == {"ready": len(TASKS), "tools": len(TASKS)}
    finally:
        gate.set()
        await app.stop()
        await server.stop()


async def test_an_index_is_built_after_the_reply_from_terms_prepared_while_listing(
    nc: Any, subjects: Subjects, settings: Settings, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The create reply waits for the store write, not for the index: it is built right after,
    # from the terms worked out while the server was listed; and built again when the toolset is
    # registered after its index left the searcher's cache.
    builds: list[tuple[int, int]] = []

    class Counted(SearchIndex):
        @classmethod
        def build(
            cls, tools: Sequence[ToolInfo], options: Any = None, prepared: PreparedTerms | None = None
        ) -> SearchIndex:
            builds.append((len(tools), len(prepared.known) if prepared is not None else 0))
            return SearchIndex.build(tools, options, prepared)

    monkeypatch.setattr(searching, "SearchIndex", Counted)
    server = McpTestServer(tools(f"prepared {prefix}"), name="billing")
    await server.start()
    app = await started(settings)
    try:
        toolset_id = await register(nc, subjects, server)
        await until(lambda: searcher_of(app).holds(toolset_id), "index built after the reply", 30)
        # (how many terms were prepared before the listing ended depends on the thread's timing)
        assert len(builds) == 1 and builds[0][0] == len(TASKS), builds
        reply = await request(
            nc, subjects.toolsets_search, {"id": toolset_id, "query": "refund a payment", "limit": 1}
        )
        assert reply["data"]["tools"][0]["name"] == "billing.refund_payment", reply
        searcher_of(app)._indexes.pop(toolset_id)  # as the cache drops it under other toolsets
        assert await register(nc, subjects, server) == toolset_id
        await until(lambda: searcher_of(app).holds(toolset_id), "index built again", 30)
        assert len(builds) == 2, builds
    finally:
        await app.stop()
        await server.stop()
