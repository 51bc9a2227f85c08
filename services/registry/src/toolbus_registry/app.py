"""Build the registry: connections, stores, service and subscribers."""

from __future__ import annotations

from nats.aio.client import Client as NatsClient
from toolbus_common import Settings, connect_nats, ensure_kv
from toolbus_common.connections import JsPlacement, close_nats
from toolbus_common.rpc import RpcServer
from toolbus_common.toolsets import ToolsetStore

from toolbus_registry.credentials import CredentialsServiceSink
from toolbus_registry.handlers import register_handlers
from toolbus_registry.listing import list_server_tools
from toolbus_registry.service import RegistryService, ToolsetCredentialSink
from toolbus_registry.workflows import WorkflowStore

QUEUE = "toolbus-registry"


class RegistryApp:
    """The registry as a runnable service (see `toolbus_common.runtime`)."""

    name = "registry"

    def __init__(self, settings: Settings, credentials: ToolsetCredentialSink | None = None) -> None:
        self.settings = settings
        self._credentials = credentials
        self._nc: NatsClient | None = None
        self._rpc: RpcServer | None = None
        self.service: RegistryService | None = None

    async def start(self) -> None:
        s = self.settings
        self._nc = await connect_nats(s, "toolbus-registry")
        js = self._nc.jetstream()
        toolsets = ToolsetStore(js, s.js_name("toolsets"), placement=JsPlacement.of(s))
        await toolsets.open()
        workflows = WorkflowStore(await ensure_kv(js, s.js_name("workflows"), placement=JsPlacement.of(s)))
        credentials = self._credentials or CredentialsServiceSink(self._nc, s.subjects)
        self.service = RegistryService(
            toolsets,
            workflows,
            list_server_tools,
            credentials=credentials,
            module_name=s.module_name,
            max_payload=self._nc.max_payload,
        )
        self._rpc = RpcServer(self._nc, queue=QUEUE)
        register_handlers(self._rpc, s.subjects, self.service)
        await self._rpc.start()

    async def stop(self) -> None:
        if self._rpc is not None:
            await self._rpc.drain()
        if self._nc is not None:
            await close_nats(self._nc)

    def ready(self) -> bool:
        return self._nc is not None and self._nc.is_connected and self._rpc is not None
