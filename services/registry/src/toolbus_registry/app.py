"""Build the registry: connection, stores, service and subjects (`toolbus_common.bus`)."""

from __future__ import annotations

import functools
from typing import Any

from toolbus_common import Settings, ensure_kv
from toolbus_common.bus import Bus, asyncapi_document
from toolbus_common.connections import JsPlacement
from toolbus_common.toolsets import ToolsetStore

from toolbus_registry.credentials import CredentialsServiceSink
from toolbus_registry.handlers import routes
from toolbus_registry.listing import list_server_tools
from toolbus_registry.paging import ENVELOPE_SLACK
from toolbus_registry.searching import open_searcher
from toolbus_registry.service import RegistryService, ToolsetCredentialSink
from toolbus_registry.workflows import WorkflowStore

QUEUE = "toolbus-registry"


class RegistryApp:
    """The registry as a runnable service (see `toolbus_common.runtime`)."""

    name = "registry"

    def __init__(self, settings: Settings, credentials: ToolsetCredentialSink | None = None) -> None:
        self.settings = settings
        self._credentials = credentials
        self.bus = Bus(settings, name="registry", queue=QUEUE)
        self.service: RegistryService | None = None

    async def start(self) -> None:
        s = self.settings
        nc = await self.bus.connect()
        js = nc.jetstream()
        toolsets = ToolsetStore(
            js,
            s.js_name("toolsets"),
            placement=JsPlacement.of(s),
            chunk_bytes=nc.max_payload - ENVELOPE_SLACK,
        )
        await toolsets.open()
        workflows = WorkflowStore(
            await ensure_kv(js, s.js_name("workflows"), placement=JsPlacement.of(s)),
            max_bytes=nc.max_payload - ENVELOPE_SLACK,
        )
        credentials = self._credentials or CredentialsServiceSink(nc, s.subjects)
        self.service = RegistryService(
            toolsets,
            workflows,
            functools.partial(
                list_server_tools, max_bytes=s.registry_max_listing_bytes, egress=s.egress.checker()
            ),
            credentials=credentials,
            module_name=s.module_name,
            max_payload=nc.max_payload,
            searcher=await open_searcher(js, s.js_name("embeddings"), placement=JsPlacement.of(s)),
            egress=s.egress,
        )
        # Before serving: a registration or search sent at once does not share the interpreter
        # with the load (docs/design.md, "Tool search").
        await self.service.searcher.load_model()
        self.bus.include(routes, self.service)
        await self.bus.start()

    async def stop(self) -> None:
        await self.bus.drain()
        if self.service is not None:
            await self.service.searcher.close()
        await self.bus.close()

    def ready(self) -> bool:
        return self.bus.ready()

    def asyncapi(self) -> dict[str, Any]:
        return asyncapi_document(self.settings, [routes], title="toolbus registry")
