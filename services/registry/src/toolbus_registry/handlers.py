"""The registry's subscribers: parse, call, reply. Nothing else."""

from __future__ import annotations

from toolbus_common.rpc import RpcServer
from toolbus_contracts import (
    Subjects,
    ToolsetCreateRequest,
    ToolsetDeclarationsRequest,
    ToolsetGetRequest,
    ToolsetSearchRequest,
    WorkflowGetRequest,
    WorkflowPublishRequest,
)

from toolbus_registry.service import RegistryService


def register_handlers(rpc: RpcServer, subjects: Subjects, service: RegistryService) -> None:
    rpc.route(subjects.toolsets_create, ToolsetCreateRequest, service.create)
    rpc.route(subjects.toolsets_get, ToolsetGetRequest, service.get)
    rpc.route(subjects.toolsets_declarations, ToolsetDeclarationsRequest, service.declarations)
    rpc.route(subjects.toolsets_search, ToolsetSearchRequest, service.search)
    rpc.route(subjects.workflows_publish, WorkflowPublishRequest, service.publish_workflow)
    rpc.route(subjects.workflows_get, WorkflowGetRequest, service.get_workflow)
