"""Pinned toolsets: where they are stored, and the tool table built from one.

The registry writes pinned toolsets; the dispatcher reads them. Both go through `ToolsetStore`,
and both turn a pinned toolset into qualified tools with `ToolTable`, so the naming of tools
(`server.tool`, `group.tool`, `http.fetch`, `workflows.name`) has exactly one definition.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore
from toolbus_contracts import EffectivePolicy, PinnedToolset, ToolInfo
from toolbus_contracts.registry import (
    HTTP_FETCH_DESCRIPTION,
    HTTP_FETCH_INPUT_SCHEMA,
    HTTP_FETCH_OUTPUT_SCHEMA,
    ToolKind,
)

from toolbus_common.connections import ensure_object_store

HTTP_FETCH = "http.fetch"


def mcp_tool_name(server: str, tool: str) -> str:
    """The qualified name of an MCP server's tool: `server.tool`."""
    return f"{server}.{tool}"


def workflow_tool_name(workflow: str) -> str:
    """The qualified name of a pinned workflow: `workflows.name`."""
    return f"workflows.{workflow}"


def qualified_names(pinned: PinnedToolset) -> list[str]:
    """Every tool's qualified name, cheaply (no tool table): for duplicate checks."""
    names = [mcp_tool_name(s.name, t.name) for s in pinned.servers for t in s.tools]
    names += [h.name for h in pinned.host]
    names += [HTTP_FETCH] if pinned.http is not None else []
    names += [workflow_tool_name(w.name) for w in pinned.workflows]
    return names


@dataclass(frozen=True, slots=True)
class Tool:
    """One callable tool of a toolset: its public info and where a call goes."""

    info: ToolInfo
    target: str
    """The MCP server name (mcp), the host tool name (host), `http`, or the workflow name."""
    remote_name: str
    """The server's own tool name (mcp); for the other kinds the qualified name or workflow name."""
    url: str | None = None
    version: str | None = None

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def kind(self) -> ToolKind:
        return self.info.kind

    @property
    def policy(self) -> EffectivePolicy:
        return self.info.policy


class ToolTable:
    """Every tool of a pinned toolset by qualified name, sorted by name."""

    def __init__(self, pinned: PinnedToolset) -> None:
        tools: list[Tool] = []
        for server in pinned.servers:
            for t in server.tools:
                info = ToolInfo(
                    name=mcp_tool_name(server.name, t.name),
                    kind="mcp",
                    description=t.description or t.title or "",
                    input_schema=t.input_schema,
                    output_schema=t.output_schema,
                    policy=EffectivePolicy.for_kind("mcp", server.policies.get(t.name)),
                )
                tools.append(Tool(info, server.name, t.name, url=server.url))
        for h in pinned.host:
            info = ToolInfo(
                name=h.name,
                kind="host",
                description=h.description,
                input_schema=h.input_schema,
                output_schema=h.output_schema,
                policy=EffectivePolicy.for_kind("host", h.policy),
            )
            tools.append(Tool(info, h.name, h.name))
        if pinned.http is not None:
            info = ToolInfo(
                name=HTTP_FETCH,
                kind="http",
                description=HTTP_FETCH_DESCRIPTION,
                input_schema=HTTP_FETCH_INPUT_SCHEMA,
                output_schema=HTTP_FETCH_OUTPUT_SCHEMA,
                policy=EffectivePolicy.for_kind("http", pinned.http.policy),
            )
            tools.append(Tool(info, "http", HTTP_FETCH))
        for w in pinned.workflows:
            info = ToolInfo(
                name=workflow_tool_name(w.name),
                kind="workflow",
                description=w.description,
                input_schema=w.input_schema,
                output_schema=w.output_schema,
                policy=EffectivePolicy.for_kind("workflow", None),
            )
            tools.append(Tool(info, w.name, w.name, version=w.version))
        tools.sort(key=lambda t: t.name)
        self.tools: tuple[Tool, ...] = tuple(tools)
        self._by_name = {t.name: t for t in tools}

    def get(self, name: str) -> Tool | None:
        return self._by_name.get(name)

    def infos(self) -> list[ToolInfo]:
        return [t.info for t in self.tools]

    def __len__(self) -> int:
        return len(self.tools)


@dataclass(frozen=True, slots=True)
class StoredToolset:
    id: str
    pinned: PinnedToolset
    table: ToolTable


class ToolsetStore:
    """Pinned toolsets in a JetStream object store (any size), with an in-process cache: a
    content-addressed toolset never changes, so a cached one never goes stale."""

    def __init__(self, js: JetStreamContext, bucket: str, *, cache_size: int = 256) -> None:
        self._js = js
        self._bucket = bucket
        self._store: ObjectStore | None = None
        self._cache: OrderedDict[str, StoredToolset] = OrderedDict()
        self._cache_size = cache_size

    async def open(self) -> None:
        self._store = await ensure_object_store(self._js, self._bucket)

    @property
    def _obj(self) -> ObjectStore:
        if self._store is None:
            raise RuntimeError("ToolsetStore.open() was not awaited")
        return self._store

    async def put(self, toolset_id: str, pinned: PinnedToolset) -> StoredToolset:
        """Store the toolset unless it is there already; returns it with its tool table."""
        if await self.get(toolset_id) is None:
            await self._obj.put(toolset_id, pinned.model_dump_json(exclude_none=True).encode())
        return self._remember(toolset_id, pinned)

    async def get(self, toolset_id: str) -> StoredToolset | None:
        hit = self._cache.get(toolset_id)
        if hit is not None:
            self._cache.move_to_end(toolset_id)
            return hit
        try:
            result = await self._obj.get(toolset_id)
        except (ObjectNotFoundError, NotFoundError):
            return None
        data: Any = result.data
        if data is None:
            return None
        return self._remember(toolset_id, PinnedToolset.model_validate_json(data))

    def _remember(self, toolset_id: str, pinned: PinnedToolset) -> StoredToolset:
        stored = self._cache.get(toolset_id) or StoredToolset(toolset_id, pinned, ToolTable(pinned))
        self._cache[toolset_id] = stored
        self._cache.move_to_end(toolset_id)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return stored
