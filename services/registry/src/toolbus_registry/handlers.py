"""The registry's subjects: parse, call `RegistryService`, reply. Nothing else."""

from __future__ import annotations

from toolbus_common.bus import RawJson, Routes
from toolbus_contracts import (
    ToolsetCreateReply,
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

from toolbus_registry.service import RegistryService

routes: Routes[RegistryService] = Routes("registry")


@routes.request(lambda s: s.toolsets_create, reply=ToolsetCreateReply)
async def handle_toolsets_create(service: RegistryService, request: ToolsetCreateRequest) -> RawJson:
    """Register a toolset (pin its servers' tools); the same toolset gets the same id. A reply
    that would not fit in one message is `{"id", "toolCount", "truncated": true}`."""
    return await service.create(request)


@routes.request(lambda s: s.toolsets_get)
async def handle_toolsets_get(service: RegistryService, request: ToolsetGetRequest) -> ToolsetGetReply:
    """A registered toolset's tools, paged with `cursor` when large."""
    return await service.get(request)


@routes.request(lambda s: s.toolsets_declarations)
async def handle_toolsets_declarations(
    service: RegistryService, request: ToolsetDeclarationsRequest
) -> ToolsetDeclarationsReply:
    """The toolset's declarations for a model: `prompt` lines or TypeScript `dts`, paged."""
    return await service.declarations(request)


@routes.request(lambda s: s.toolsets_search)
async def handle_toolsets_search(
    service: RegistryService, request: ToolsetSearchRequest
) -> ToolsetSearchReply:
    """The toolset's tools that best match a query, best first."""
    return await service.search(request)


@routes.request(lambda s: s.toolsets_namespaces)
async def handle_toolsets_namespaces(
    service: RegistryService, request: ToolsetNamespacesRequest
) -> ToolsetNamespacesReply:
    """The toolset's namespaces (kind, tool count, one-line summary), paged with `cursor`."""
    return await service.namespaces(request)


@routes.request(lambda s: s.workflows_publish)
async def handle_workflows_publish(
    service: RegistryService, request: WorkflowPublishRequest
) -> WorkflowPublishReply:
    """Publish a workflow version (content-addressed)."""
    return await service.publish_workflow(request)


@routes.request(lambda s: s.workflows_get)
async def handle_workflows_get(service: RegistryService, request: WorkflowGetRequest) -> Workflow:
    """One workflow version (the latest when no version is given)."""
    return await service.get_workflow(request)
