"""The registry's logic: register, read, render and search toolsets; publish and read workflows.
No NATS subjects here; `handlers.py` maps subjects onto these methods."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from toolbus_common.bus import RawJson
from toolbus_common.egress import EgressPolicy
from toolbus_common.lru import Lru
from toolbus_common.toolsets import StoredToolset, ToolsetStore
from toolbus_contracts import (
    Credentials,
    Declarations,
    NamespaceInfo,
    ToolsetCreateRequest,
    ToolsetDeclarationsReply,
    ToolsetDeclarationsRequest,
    ToolsetGetReply,
    ToolsetGetRequest,
    ToolsetNamespacesReply,
    ToolsetNamespacesRequest,
    ToolsetSearchReply,
    ToolsetSearchRequest,
    Workflow,
    WorkflowGetRequest,
    WorkflowPublishReply,
    WorkflowPublishRequest,
)
from toolbus_contracts.base import bounded
from toolbus_contracts.errors import InvalidRequest, NotFound

from toolbus_registry.catalogue import catalogue
from toolbus_registry.declarations import declarations_floor, render_dts, render_prompt
from toolbus_registry.paging import (
    ENVELOPE_SLACK,
    decode_cursor,
    encode_cursor,
    fitting,
    page_items,
    page_text,
)
from toolbus_registry.pinning import Pinner, ToolLister, check_json_schema
from toolbus_registry.search import PreparedTerms
from toolbus_registry.search.index import scope_name
from toolbus_registry.searching import Searcher
from toolbus_registry.workflows import WorkflowStore

log = logging.getLogger("toolbus.registry")


class ToolsetCredentialSink(Protocol):
    """Where registration's `credentials` land: the toolset level of the credential store."""

    async def set_toolset(self, toolset_id: str, credentials: Credentials) -> None: ...


_WARM_DELAY = 0.01
"""Seconds between a create reply and the background index build, embedding and rendering, so
the reply is written out before that CPU-bound work competes for the interpreter (a search that
comes first starts the index build itself)."""
WARMED_SIZE = 1024
"""Toolset ids whose declarations and search index were built in the background (both caches
have their own bounds; this only avoids warming the same toolset again on every create)."""
REPLY_CACHE_BYTES = 16 * 1024 * 1024
"""Create replies kept per toolset id (content-addressed, so never stale), by total size."""
RENDERED_SIZE = 64
"""Toolsets whose declarations are kept rendered."""
CATALOGUE_SIZE = 256
"""Toolsets whose namespace catalogue is kept (a few KiB each)."""
NAMESPACE_RENDERED_SIZE = 256
"""Namespaces whose declarations (one namespace browsed) are kept rendered."""


@dataclass(frozen=True, slots=True)
class Rendered:
    prompt: str
    dts: str


class RegistryService:
    def __init__(
        self,
        toolsets: ToolsetStore,
        workflows: WorkflowStore,
        lister: ToolLister,
        *,
        credentials: ToolsetCredentialSink | None,
        module_name: str,
        max_payload: int,
        searcher: Searcher | None = None,
        egress: EgressPolicy | None = None,
    ) -> None:
        """`egress`: the deployment's egress policy, which MCP URLs and `http.allow` entries are
        checked against at registration (default: public addresses only)."""
        self._toolsets = toolsets
        self._workflows = workflows
        self._credentials = credentials
        self._module_name = module_name
        self._budget = max_payload - ENVELOPE_SLACK
        self._pinner = Pinner(lister, workflows.get, self._pinned, page_bytes=self._budget, egress=egress)
        self._rendered: Lru[str, Rendered] = Lru(RENDERED_SIZE)
        self._catalogues: Lru[str, list[NamespaceInfo]] = Lru(CATALOGUE_SIZE)
        self._namespace_rendered: Lru[tuple[str, str], Rendered] = Lru(NAMESPACE_RENDERED_SIZE)
        self._replies: Lru[str, RawJson] = Lru(REPLY_CACHE_BYTES, weight=lambda _, reply: len(reply))
        self._searcher = searcher or Searcher()
        self._warming: dict[str, asyncio.Task[None]] = {}
        self._warmed: Lru[str, bool] = Lru(WARMED_SIZE)

    @property
    def searcher(self) -> Searcher:
        return self._searcher

    async def _pinned(self, toolset_id_: str) -> Any:
        stored = await self._toolsets.get(toolset_id_)
        return stored.pinned if stored else None

    async def _stored(self, toolset_id_: str) -> StoredToolset:
        stored = await self._toolsets.get(toolset_id_)
        if stored is None:
            raise NotFound(f"Toolset '{toolset_id_}' is not registered.", details={"field": "id"})
        return stored

    def _render(self, stored: StoredToolset) -> Rendered:
        """Declarations are deterministic per content-addressed toolset: render once, cache."""
        hit = self._rendered.get(stored.id)
        if hit is None:
            infos = stored.table.infos()
            hit = Rendered(prompt=render_prompt(infos), dts=render_dts(infos, self._module_name))
            self._rendered.put(stored.id, hit)
        return hit

    def _catalogue(self, stored: StoredToolset) -> list[NamespaceInfo]:
        """The toolset's namespaces (content-addressed: computed once, cached)."""
        hit = self._catalogues.get(stored.id)
        if hit is None:
            hit = catalogue(stored.pinned)
            self._catalogues.put(stored.id, hit)
        return hit

    def _check_namespaces(self, stored: StoredToolset, namespaces: list[str], field: str) -> None:
        """Refuse a namespace the toolset does not have, naming the field (`namespaces[1]`)."""
        known = {n.name for n in self._catalogue(stored)}
        for i, name in enumerate(namespaces):
            if name not in known:
                where = f"{field}[{i}]" if field == "namespaces" else field
                raise InvalidRequest(
                    f"Field '{where}': toolset '{stored.id}' has no namespace '{bounded(name, 80)}' "
                    "(toolsets.namespaces lists them).",
                    details={"field": where},
                )

    def _render_namespace(self, stored: StoredToolset, namespace: str) -> Rendered:
        """One namespace's declarations (a model browsing it), rendered once and cached."""
        key = (stored.id, namespace)
        hit = self._namespace_rendered.get(key)
        if hit is None:
            infos = [t.info for t in stored.table.tools if scope_name(t.name) == namespace]
            hit = Rendered(prompt=render_prompt(infos), dts=render_dts(infos, self._module_name))
            self._namespace_rendered.put(key, hit)
        return hit

    # ---- toolsets ---------------------------------------------------------------------------

    async def create(self, req: ToolsetCreateRequest) -> RawJson:
        prepared = PreparedTerms()
        try:
            pinned = await self._pinner.pin(req, on_pinned=self._searcher.preparing(prepared))
        finally:
            prepared.close()  # the listing is over (or failed): nothing more is added
        tid = pinned.id
        self._searcher.prepared_for(tid, prepared)
        stored = self._toolsets.entry(tid, pinned.toolset)
        cached = self._replies.get(tid)
        # The reply waits for the store write, not for the search index: the index is built in
        # the background right after the reply (`_warm`), and a search that comes first waits
        # for that build (`Searcher.index`), which starts from the terms prepared while the
        # servers were listed. Built before the reply, the index held the GIL against the store
        # write and added its whole time to the registration (docs/design.md).
        if cached is None:
            _, reply = await asyncio.gather(
                self._toolsets.save(stored, pinned.stored_json), self._create_reply(stored)
            )
            self._replies.put(tid, reply)
        else:
            await self._toolsets.save(stored, pinned.stored_json)
            reply = cached
        if req.credentials is not None and self._credentials is not None:
            await self._credentials.set_toolset(tid, req.credentials)
        self._warm(stored)
        return reply

    async def _create_reply(self, stored: StoredToolset) -> RawJson:
        """The create reply of a toolset, or its truncated form when it would not fit in a message
        (then the declarations are not rendered here: `_warm` renders them for the paged reads)."""
        wires = stored.table.wire()
        truncated = RawJson(orjson.dumps({"id": stored.id, "toolCount": len(wires), "truncated": True}))
        tools = orjson.dumps(wires)
        if len(tools) > self._budget or (
            len(tools) + declarations_floor((w["name"], w["description"]) for w in wires) > self._budget
        ):
            return truncated
        rendered = await asyncio.to_thread(self._render, stored)
        declarations = Declarations(prompt=rendered.prompt, dts=rendered.dts).wire_json()
        reply = b'{"id":"%s","tools":%s,"declarations":%s}' % (stored.id.encode(), tools, declarations)
        return truncated if len(reply) > self._budget else RawJson(reply)

    def _warm(self, stored: StoredToolset) -> None:
        """Build a toolset's search index, embed its tools and render its declarations in the
        background, once the reply is out: search and declarations are usually asked for next.
        A toolset warmed before is warmed again when its index has left the searcher's cache."""
        if stored.id in self._warming or (stored.id in self._warmed and self._searcher.holds(stored.id)):
            return

        async def later() -> None:
            await asyncio.sleep(_WARM_DELAY)
            try:
                await self._searcher.warm(stored)  # the index now, the embedding in background
                await self._searcher.after_searches()  # a first search waiting for the index first
                await asyncio.to_thread(self._render, stored)
                self._catalogue(stored)  # what an agent reads first (milliseconds)
            except Exception:  # a search or a declarations read tries again (and answers the error)
                log.exception("warming toolset %s failed", stored.id)
                return
            self._warmed.put(stored.id, True)

        task = asyncio.create_task(later())
        self._warming[stored.id] = task
        task.add_done_callback(lambda _: self._warming.pop(stored.id, None))

    async def warmed(self) -> None:
        """Until the toolsets registered so far are warmed (declarations rendered, embeddings
        started): for benches and tests that want no background work but the embedding."""
        await asyncio.gather(*self._warming.values(), return_exceptions=True)

    async def get(self, req: ToolsetGetRequest) -> ToolsetGetReply:
        stored = await self._stored(req.id)
        tools = stored.table.wire()
        scope = f"{req.id}:tools"
        page, nxt = page_items(tools, decode_cursor(req.cursor, scope, len(tools)), self._budget)
        state = self._searcher.vectors(req.id)
        return ToolsetGetReply.model_validate(
            {
                "id": req.id,
                "tools": page,
                "nextCursor": encode_cursor(scope, nxt) if nxt is not None else None,
                "vectors": {"ready": state[0], "tools": state[1]} if state is not None else None,
            }
        )

    async def namespaces(self, req: ToolsetNamespacesRequest) -> ToolsetNamespacesReply:
        stored = await self._stored(req.id)
        items = [n.wire() for n in self._catalogue(stored)]
        scope = f"{req.id}:namespaces"
        page, nxt = page_items(items, decode_cursor(req.cursor, scope, len(items)), self._budget)
        return ToolsetNamespacesReply.model_validate(
            {
                "id": req.id,
                "namespaces": page,
                "nextCursor": encode_cursor(scope, nxt) if nxt is not None else None,
            }
        )

    async def declarations(self, req: ToolsetDeclarationsRequest) -> ToolsetDeclarationsReply:
        stored = await self._stored(req.id)
        if req.namespace is None:
            rendered = await asyncio.to_thread(self._render, stored)
            scope = f"{req.id}:{req.format}"
        else:
            self._check_namespaces(stored, [req.namespace], "namespace")
            rendered = await asyncio.to_thread(self._render_namespace, stored, req.namespace)
            scope = f"{req.id}:{req.format}:{req.namespace}"
        text = rendered.prompt if req.format == "prompt" else rendered.dts
        chunk, nxt = page_text(text, decode_cursor(req.cursor, scope, len(text)), self._budget)
        return ToolsetDeclarationsReply(
            format=req.format, text=chunk, next_cursor=encode_cursor(scope, nxt) if nxt is not None else None
        )

    async def search(self, req: ToolsetSearchRequest) -> ToolsetSearchReply:
        stored = await self._stored(req.id)
        if req.namespaces is not None:
            self._check_namespaces(stored, req.namespaces, "namespaces")
        reply = await self._searcher.search(stored, req.query, req.limit, req.namespaces)
        return ToolsetSearchReply(tools=fitting(reply.tools, self._budget), ranking=reply.ranking)

    # ---- workflows --------------------------------------------------------------------------

    async def publish_workflow(self, req: WorkflowPublishRequest) -> WorkflowPublishReply:
        check_json_schema(req.input_schema, "inputSchema")
        if req.output_schema is not None:
            check_json_schema(req.output_schema, "outputSchema")
        workflow = await self._workflows.publish(req)
        return WorkflowPublishReply(name=workflow.name, version=workflow.version)

    async def get_workflow(self, req: WorkflowGetRequest) -> Workflow:
        workflow = await self._workflows.get(req.name, req.version)
        if workflow is None:
            what = (
                f"version {req.version} of workflow '{req.name}'" if req.version else f"workflow '{req.name}'"
            )
            raise NotFound(f"No published {what}.", details={"field": "version" if req.version else "name"})
        return workflow
