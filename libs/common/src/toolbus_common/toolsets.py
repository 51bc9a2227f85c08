"""Pinned toolsets: where they are stored, and the tool table built from one.

The registry writes pinned toolsets; the dispatcher reads them. Both go through `ToolsetStore`,
and both turn a pinned toolset into qualified tools with `ToolTable`, so the naming of tools
(`server.tool`, `group.tool`, `http.fetch`, `workflows.name`) has exactly one definition.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
from collections.abc import Callable
from typing import Any

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import ObjectMeta, ObjectMetaOptions
from nats.js.errors import (
    BadObjectMetaError,
    DigestMismatchError,
    LinkIsABucketError,
    NotFoundError,
    ObjectNotFoundError,
)
from nats.js.object_store import OBJ_DEFAULT_CHUNK_SIZE, ObjectStore
from pydantic import ValidationError
from toolbus_contracts import EffectivePolicy, PinnedTool, PinnedToolset, ToolInfo
from toolbus_contracts.registry import (
    HTTP_FETCH_DESCRIPTION,
    HTTP_FETCH_INPUT_SCHEMA,
    HTTP_FETCH_OUTPUT_SCHEMA,
    ToolKind,
)

from toolbus_common.canonical import content_id
from toolbus_common.connections import DEFAULT_PLACEMENT, JsPlacement, ensure_object_store
from toolbus_common.integrity import altered
from toolbus_common.lru import Lru

log = logging.getLogger(__name__)

MAX_CHUNK_BYTES = 1024 * 1024
"""The largest chunk a toolset is stored in (NATS's default max_payload)."""

HTTP_FETCH = "http.fetch"

TOOLSET_ID_PREFIX = "ts_"

READ_TIMEOUT = 15.0
"""Seconds a toolset's read from the object store may take (a 1,000-tool one takes ~50 ms)."""

_ALTERED_OBJECT = (BadObjectMetaError, DigestMismatchError, LinkIsABucketError)
"""What nats-py raises reading an object whose metadata or chunks were written over."""


def mcp_tool_name(server: str, tool: str) -> str:
    """The qualified name of an MCP server's tool: `server.tool`."""
    return f"{server}.{tool}"


def mcp_tool_description(tool: PinnedTool) -> str:
    """What a pinned MCP tool's `ToolInfo` shows as its description: its own, else its title."""
    return tool.description or tool.title or ""


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


class Tool:
    """One callable tool of a toolset: its info, as the wire shows it, and where a call goes."""

    __slots__ = ("_info", "kind", "name", "policy", "remote_name", "target", "url", "version", "wire")

    def __init__(
        self,
        wire: dict[str, Any],
        policy: EffectivePolicy,
        target: str,
        remote_name: str,
        url: str | None = None,
        version: str | None = None,
    ) -> None:
        self.wire = wire
        """The tool's `ToolInfo` in wire form (what replies show); shared, never to be mutated."""
        self.name: str = wire["name"]
        self.kind: ToolKind = wire["kind"]
        self.policy = policy
        self.target = target
        """The MCP server name (mcp), the host tool name (host), `http`, or the workflow name."""
        self.remote_name = remote_name
        """The server's own tool name (mcp); for the other kinds the qualified name or workflow name."""
        self.url = url
        self.version = version
        self._info: ToolInfo | None = None

    @property
    def info(self) -> ToolInfo:
        """The tool's `ToolInfo`, made from its wire form on first use without validating it
        again: the wire form is written from a toolset validated when it was pinned or read
        (`_info_wire`; validating 1,350 tools again cost ~9 ms before a first search)."""
        if self._info is None:
            wire = self.wire
            fields: dict[str, Any] = {
                "name": wire["name"],
                "kind": wire["kind"],
                "description": wire["description"],
                "input_schema": wire["inputSchema"],
                "policy": self.policy,
            }
            if "outputSchema" in wire:
                fields["output_schema"] = wire["outputSchema"]
            self._info = ToolInfo.model_construct(**fields)
        return self._info


@functools.lru_cache(maxsize=1024)
def _policy_wire(policy: EffectivePolicy) -> dict[str, Any]:
    return policy.wire()


def _info_wire(
    name: str,
    kind: ToolKind,
    description: str,
    input_schema: dict[str, Any],
    output_schema: dict[str, Any] | None,
    policy: EffectivePolicy,
) -> dict[str, Any]:
    """`ToolInfo(...).wire()` for parts of a pinned toolset (validated when it was pinned),
    written directly: ~1 µs a tool, where building and dumping a `ToolInfo` costs ~10."""
    wire = {"name": name, "kind": kind, "description": description, "inputSchema": input_schema}
    if output_schema is not None:
        wire["outputSchema"] = output_schema
    wire["policy"] = _policy_wire(policy)
    return wire


class ToolTable:
    """Every tool of a pinned toolset by qualified name, sorted by name."""

    def __init__(self, pinned: PinnedToolset) -> None:
        tools: list[Tool] = []
        for server in pinned.servers:
            for t in server.tools:
                policy = EffectivePolicy.for_kind("mcp", server.policies.get(t.name))
                name = mcp_tool_name(server.name, t.name)
                description = mcp_tool_description(t)
                wire = _info_wire(name, "mcp", description, t.input_schema, t.output_schema, policy)
                tools.append(Tool(wire, policy, server.name, t.name, url=server.url))
        for h in pinned.host:
            policy = EffectivePolicy.for_kind("host", h.policy)
            wire = _info_wire(h.name, "host", h.description, h.input_schema, h.output_schema, policy)
            tools.append(Tool(wire, policy, h.name, h.name))
        if pinned.http is not None:
            policy = EffectivePolicy.for_kind("http", pinned.http.policy)
            wire = _info_wire(
                HTTP_FETCH,
                "http",
                HTTP_FETCH_DESCRIPTION,
                HTTP_FETCH_INPUT_SCHEMA,
                HTTP_FETCH_OUTPUT_SCHEMA,
                policy,
            )
            tools.append(Tool(wire, policy, "http", HTTP_FETCH))
        for w in pinned.workflows:
            policy = EffectivePolicy.for_kind("workflow", None)
            name = workflow_tool_name(w.name)
            wire = _info_wire(name, "workflow", w.description, w.input_schema, w.output_schema, policy)
            tools.append(Tool(wire, policy, w.name, w.name, version=w.version))
        tools.sort(key=lambda t: t.name)
        self.tools: tuple[Tool, ...] = tuple(tools)
        self._by_name = {t.name: t for t in tools}

    def get(self, name: str) -> Tool | None:
        return self._by_name.get(name)

    def infos(self) -> list[ToolInfo]:
        return [t.info for t in self.tools]

    def wire(self) -> list[dict[str, Any]]:
        """Every tool's `ToolInfo` in wire form, as replies show them."""
        return [t.wire for t in self.tools]

    def __len__(self) -> int:
        return len(self.tools)


class StoredToolset:
    """A pinned toolset under its id, with its tool table (built on first use: a toolset
    being registered is written while its table is built, see `ToolsetStore.entry`)."""

    __slots__ = ("_table", "id", "pinned")

    def __init__(self, toolset_id: str, pinned: PinnedToolset) -> None:
        self.id = toolset_id
        self.pinned = pinned
        self._table: ToolTable | None = None

    @property
    def table(self) -> ToolTable:
        if self._table is None:
            self._table = ToolTable(self.pinned)
        return self._table


class ToolsetStore:
    """Pinned toolsets in a JetStream object store (any size), with an in-process cache: a
    content-addressed toolset never changes, so a cached one never goes stale."""

    def __init__(
        self,
        js: JetStreamContext,
        bucket: str,
        *,
        cache_size: int = 256,
        placement: JsPlacement = DEFAULT_PLACEMENT,
        chunk_bytes: int = OBJ_DEFAULT_CHUNK_SIZE,
    ) -> None:
        self._js = js
        self._bucket = bucket
        self._placement = placement
        # Between nats-py's default 128 KiB and NATS's default max_payload (1 MiB): the writer
        # passes its connection's max_payload, which a server configured larger would make huge.
        self._chunk_bytes = min(max(chunk_bytes, OBJ_DEFAULT_CHUNK_SIZE), MAX_CHUNK_BYTES)
        self._store: ObjectStore | None = None
        self._cache: Lru[str, StoredToolset] = Lru(cache_size)

    async def open(self) -> None:
        self._store = await ensure_object_store(self._js, self._bucket, placement=self._placement)

    @property
    def _obj(self) -> ObjectStore:
        if self._store is None:
            raise RuntimeError("ToolsetStore.open() was not awaited")
        return self._store

    async def put(self, toolset_id: str, pinned: PinnedToolset) -> StoredToolset:
        """Store the toolset unless it is there already; returns it (with its tool table)."""
        stored = self.entry(toolset_id, pinned)
        await self.save(stored)
        return stored

    def entry(self, toolset_id: str, pinned: PinnedToolset) -> StoredToolset:
        """The cached toolset of this id, else a new entry for `pinned`, not stored yet (`save`)."""
        return self._cache.get(toolset_id) or StoredToolset(toolset_id, pinned)

    async def save(self, stored: StoredToolset, encode: Callable[[], bytes] | None = None) -> None:
        """Store an entry unless it is there already, then cache it. `encode`, where the caller
        has one, gives the JSON of `stored.pinned.wire()` (the registry's gives the canonical JSON
        the id is the hash of, computed when pinning): called only when the toolset is written.

        Whether it is there is asked of the object's info alone (an uncached toolset stored
        already is not read back whole), and it is written in chunks of `chunk_bytes`: a writer
        that knows its connection's `max_payload` stores a 1,000-tool toolset (~1 MB) in one or two
        acknowledged publishes instead of eight of the default 128 KiB."""
        if self._cache.get(stored.id) is None and not await self._stored(stored.id):
            data = encode() if encode is not None else stored.pinned.wire_json()
            # nats-py's put allocates a buffer of the whole chunk size whatever the data's size.
            chunk = min(self._chunk_bytes, max(len(data), 1))
            meta = ObjectMeta(name=stored.id, options=ObjectMetaOptions(max_chunk_size=chunk))
            await self._obj.put(stored.id, data, meta=meta)
        self._remember(stored)

    async def _stored(self, toolset_id: str) -> bool:
        try:
            await self._obj.get_info(toolset_id)  # raises for a deleted one too
        except (ObjectNotFoundError, NotFoundError):
            return False
        return True

    async def get(self, toolset_id: str) -> StoredToolset | None:
        """The toolset stored under this id, None if there is none; raises `StoredCopyAltered`
        (logged) when the stored copy is not the content the id addresses (`verified`)."""
        hit = self._cache.get(toolset_id)
        if hit is not None:
            return hit
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                result = await self._obj.get(toolset_id)
        except TimeoutError:
            # nats-py waits without end for chunks its metadata names and the stream lacks
            # (metadata written over): answered unavailable, never a request left unanswered.
            log.warning("reading a stored toolset timed out", extra={"toolsetId": toolset_id})
            raise nats.errors.TimeoutError from None
        except (ObjectNotFoundError, NotFoundError):
            return None
        except _ALTERED_OBJECT:
            raise altered("toolset", toolset_id, field="toolsetId") from None
        data: Any = result.data
        if not data:
            raise altered("toolset", toolset_id, field="toolsetId")
        return self._remember(StoredToolset(toolset_id, verified(toolset_id, data)))

    def _remember(self, stored: StoredToolset) -> StoredToolset:
        stored = self._cache.get(stored.id) or stored
        self._cache.put(stored.id, stored)
        return stored


def verified(toolset_id: str, data: bytes) -> PinnedToolset:
    """The pinned toolset in `data` if its content address is `toolset_id`, else
    `StoredCopyAltered` (logged). The registry stores the canonical JSON the id is the hash of,
    so one SHA-256 of the bytes read settles the common case; a copy stored in another form
    (numbers JCS cannot write exactly, a writer without the canonical form) is parsed and its
    canonical form hashed."""
    fast = TOOLSET_ID_PREFIX + hashlib.sha256(data).hexdigest() == toolset_id
    try:
        pinned = PinnedToolset.model_validate_json(data)
    except ValidationError:
        raise altered("toolset", toolset_id, field="toolsetId") from None
    if not fast and content_id(TOOLSET_ID_PREFIX, pinned.wire()) != toolset_id:
        raise altered("toolset", toolset_id, field="toolsetId")
    return pinned
