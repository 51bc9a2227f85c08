"""The request subjects of the credentials service: parse, call, reply (`toolbus_common.rpc`)."""

from __future__ import annotations

from toolbus_common.rpc import RpcServer
from toolbus_contracts import Subjects
from toolbus_contracts.credentials import (
    NamespaceCredentialsSetRequest,
    RunCredentialsSetRequest,
    ToolsetCredentialsSetRequest,
)

from toolbus_credentials.service import CredentialsLogic


def register_handlers(rpc: RpcServer, subjects: Subjects, logic: CredentialsLogic) -> None:
    """`toolsets.credentials.set`, `namespaces.credentials.set`, `runs.credentials.set`."""
    rpc.route(subjects.toolsets_credentials_set, ToolsetCredentialsSetRequest, logic.set_toolset)
    rpc.route(subjects.namespaces_credentials_set, NamespaceCredentialsSetRequest, logic.set_namespace)
    rpc.route(subjects.runs_credentials_set, RunCredentialsSetRequest, logic.set_run)
