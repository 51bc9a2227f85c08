"""Registry and credentials calls: toolsets, their declarations and search, workflows, and the
toolset- and namespace-level credentials."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from toolbus_contracts import (
    Credentials,
    CredentialsSetReply,
    Declarations,
    HostToolSpec,
    HttpSpec,
    McpServerSpec,
    NamespaceCredentialsSetRequest,
    ToolInfo,
    ToolsetCreateReply,
    ToolsetCreateRequest,
    ToolsetCredentialsSetRequest,
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
from toolbus_contracts.registry import NamespaceInfo, SearchHit, VectorState

from toolbus._connections import Connection, Connections
from toolbus._core import Core, build
from toolbus._host_tools import HostTool

Format = Literal["prompt", "dts"]
Progress = Callable[[str, int, int | None], None]
"""`progress(stage, done, total)`: told what a long registration is doing (the CLI draws it)."""

CredentialsLike = Credentials | Mapping[str, Any]


@dataclass(frozen=True)
class Toolset:
    """A registered toolset: its content-addressed id, every tool with its effective policy, and
    (from `create`) the declarations rendered for a model."""

    id: str
    tools: list[ToolInfo]
    declarations: Declarations | None = None
    vectors: VectorState | None = None
    """From `get`: how many tools are embedded yet (search is at full quality when all are)."""

    def tool(self, name: str) -> ToolInfo:
        """The tool of this qualified name (`KeyError` when there is none)."""
        for tool in self.tools:
            if tool.name == name:
                return tool
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tools]


def toolset_id(toolset: Toolset | str) -> str:
    return toolset.id if isinstance(toolset, Toolset) else toolset


def credentials_body(credentials: CredentialsLike) -> Credentials | dict[str, Any]:
    """As given, for the request's `build` to check: a bad field is named from the request's
    root (`credentials.servers.gh.headers`), as the service names it."""
    return credentials if isinstance(credentials, Credentials) else dict(credentials)


def _host_entry(entry: HostTool | HostToolSpec | Mapping[str, Any]) -> Any:
    if isinstance(entry, HostTool):
        return entry.spec()
    return entry


class Toolsets:
    """`‹p›.toolsets.*`: register, read, render, search, and set toolset-level credentials."""

    def __init__(self, tb: Core) -> None:
        self._tb = tb

    async def create(
        self,
        *,
        mcp: Sequence[McpServerSpec | Mapping[str, Any]] = (),
        host: Iterable[HostTool | HostToolSpec | Mapping[str, Any]] = (),
        http: HttpSpec | Mapping[str, Any] | None = None,
        workflows: Sequence[str] = (),
        base: Toolset | str | None = None,
        credentials: CredentialsLike | None = None,
        timeout: float | None = None,
        progress: Progress | None = None,
    ) -> Toolset:
        """Register a toolset (or derive one from `base`) and return it whole.

        `host` takes `@host_tool` functions as they are, so the schema registered is the one the
        worker serves. A reply too large for one message (`truncated`) is completed page by page
        from `toolsets.get` and `toolsets.declarations`; `progress` hears about each stage.
        """
        body = build(
            ToolsetCreateRequest,
            mcp=list(mcp),
            host=[_host_entry(h) for h in host],
            http=http,
            workflows=list(workflows),
            base=toolset_id(base) if base is not None else None,
            credentials=credentials_body(credentials) if credentials is not None else None,
        )
        if progress:
            progress("registering", 0, len(body.mcp) or None)
        reply = ToolsetCreateReply.model_validate(
            await self._tb.request(self._tb.subjects.toolsets_create, body, timeout=timeout, retry=True)
        )
        if progress:
            progress("registered", len(body.mcp), len(body.mcp) or None)
        if not reply.truncated and reply.tools is not None:
            return Toolset(reply.id, reply.tools, reply.declarations)
        full = await self.get(reply.id, progress=progress, total=reply.tool_count)
        prompt = await self.declarations(reply.id, "prompt", progress=progress)
        dts = await self.declarations(reply.id, "dts", progress=progress)
        return Toolset(full.id, full.tools, Declarations(prompt=prompt, dts=dts))

    async def get(
        self, toolset: Toolset | str, *, progress: Progress | None = None, total: int | None = None
    ) -> Toolset:
        """A registered toolset's tools (every page) and its embedding state, without declarations.
        Unknown id: `NotFound`."""
        tools: list[ToolInfo] = []
        cursor: str | None = None
        while True:
            body = build(ToolsetGetRequest, id=toolset_id(toolset), cursor=cursor)
            page = ToolsetGetReply.model_validate(
                await self._tb.request(self._tb.subjects.toolsets_get, body, retry=True)
            )
            tools.extend(page.tools)
            if progress:
                progress("tools", len(tools), total)
            if not page.next_cursor:
                return Toolset(page.id, tools, vectors=page.vectors)
            cursor = page.next_cursor

    async def declarations(
        self,
        toolset: Toolset | str,
        format: Format = "prompt",
        *,
        namespace: str | None = None,
        progress: Progress | None = None,
    ) -> str:
        """The whole `prompt` or `dts` document of a toolset (every page concatenated), or of one
        of its namespaces' tools (`namespace`; one it does not have is `InvalidRequest`)."""
        parts: list[str] = []
        cursor: str | None = None
        while True:
            body = build(
                ToolsetDeclarationsRequest,
                id=toolset_id(toolset),
                format=format,
                cursor=cursor,
                namespace=namespace,
            )
            page = ToolsetDeclarationsReply.model_validate(
                await self._tb.request(self._tb.subjects.toolsets_declarations, body, retry=True)
            )
            parts.append(page.text)
            if progress:
                progress(format, len(parts), None)
            if not page.next_cursor:
                return "".join(parts)
            cursor = page.next_cursor

    async def search(
        self, toolset: Toolset | str, query: str, limit: int = 5, *, namespaces: Sequence[str] | None = None
    ) -> list[SearchHit]:
        """The `limit` tools (1..50) that best match `query`, best first; only tools of
        `namespaces` when given (a name the toolset does not have is `InvalidRequest`)."""
        return list((await self.search_reply(toolset, query, limit, namespaces=namespaces)).tools)

    async def search_reply(
        self, toolset: Toolset | str, query: str, limit: int = 5, *, namespaces: Sequence[str] | None = None
    ) -> ToolsetSearchReply:
        """`search`'s whole reply: the hits and how they were ranked (`ranking`)."""
        body = build(
            ToolsetSearchRequest,
            id=toolset_id(toolset),
            query=query,
            limit=limit,
            namespaces=list(namespaces) if namespaces is not None else None,
        )
        return ToolsetSearchReply.model_validate(
            await self._tb.request(self._tb.subjects.toolsets_search, body, retry=True)
        )

    async def namespaces(self, toolset: Toolset | str) -> list[NamespaceInfo]:
        """Every namespace of a toolset (every page): name, kind, tool count, one-line summary."""
        out: list[NamespaceInfo] = []
        cursor: str | None = None
        while True:
            body = build(ToolsetNamespacesRequest, id=toolset_id(toolset), cursor=cursor)
            page = ToolsetNamespacesReply.model_validate(
                await self._tb.request(self._tb.subjects.toolsets_namespaces, body, retry=True)
            )
            out.extend(page.namespaces)
            if page.next_cursor is None:
                return out
            cursor = page.next_cursor

    async def connect(
        self,
        toolset: Toolset | str,
        server: str,
        *,
        client: Mapping[str, str] | None = None,
        grant: Literal["authorizationCode", "clientCredentials"] = "authorizationCode",
        scopes: Sequence[str] | None = None,
        max_scopes: Sequence[str] | None = None,
    ) -> Connection:
        """A toolset-level OAuth connection: `grant="clientCredentials"` with
        `client={"clientId", "clientSecret"}` connects at once (machine to machine); a server's
        step-up challenge may widen its token only to `scopes` and `max_scopes`."""
        return await Connections(self._tb).connect(
            server,
            toolset_id=toolset_id(toolset),
            grant=grant,
            client=dict(client) if client is not None else None,
            scopes=list(scopes) if scopes is not None else None,
            max_scopes=list(max_scopes) if max_scopes is not None else None,
        )

    async def set_credentials(self, toolset: Toolset | str, credentials: CredentialsLike) -> str:
        """Replace the toolset-level credentials (`{"servers": {name: {"headers": {...}}}}`);
        returns the level, `"toolset"`. Calls parked at this level are sent again."""
        body = build(
            ToolsetCredentialsSetRequest,
            toolset_id=toolset_id(toolset),
            credentials=credentials_body(credentials),
        )
        data = await self._tb.request(self._tb.subjects.toolsets_credentials_set, body, retry=True)
        return CredentialsSetReply.model_validate(data).level


class Namespaces:
    """`‹p›.namespaces.credentials.set`: credentials of one end user for one toolset; OAuth
    connections of one end user (`connect`, `connections`, `disconnect`)."""

    def __init__(self, tb: Core) -> None:
        self._tb = tb

    async def connect(
        self,
        namespace: str,
        toolset: Toolset | str,
        server: str,
        *,
        scopes: Sequence[str] | None = None,
        client: Mapping[str, str] | None = None,
    ) -> Connection:
        """Connect the end user's account at `server` (OAuth): send them to
        `conn.authorization_url`, then `await conn.wait()`. Tokens are kept and renewed by toolbus."""
        return await Connections(self._tb).connect(
            server,
            toolset_id=toolset_id(toolset),
            namespace=namespace,
            scopes=list(scopes) if scopes is not None else None,
            client=dict(client) if client is not None else None,
        )

    async def connections(self, namespace: str, toolset: Toolset | str) -> list[dict[str, Any]]:
        """The end user's OAuth connections: server, status, scopes, until when, last refresh."""
        reply = await Connections(self._tb).status(toolset_id=toolset_id(toolset), namespace=namespace)
        return [c.model_dump(mode="json", by_alias=True) for c in reply.connections]

    async def disconnect(self, namespace: str, toolset: Toolset | str, server: str) -> bool:
        """Remove the connection (revoking its token where the server offers it); True if revoked."""
        reply = await Connections(self._tb).disconnect(
            server, toolset_id=toolset_id(toolset), namespace=namespace
        )
        return reply.revoked

    async def set_credentials(
        self, namespace: str, toolset: Toolset | str, credentials: CredentialsLike
    ) -> str:
        body = build(
            NamespaceCredentialsSetRequest,
            namespace=namespace,
            toolset_id=toolset_id(toolset),
            credentials=credentials_body(credentials),
        )
        data = await self._tb.request(self._tb.subjects.namespaces_credentials_set, body, retry=True)
        return CredentialsSetReply.model_validate(data).level


class Workflows:
    """`‹p›.workflows.publish` / `.get`."""

    def __init__(self, tb: Core) -> None:
        self._tb = tb

    async def publish(
        self,
        name: str,
        *,
        input_schema: Mapping[str, Any],
        output_schema: Mapping[str, Any] | None = None,
        description: str = "",
        definition: Any = None,
    ) -> str:
        """Publish a workflow version; returns its version (the same content gives the same one)."""
        body = build(
            WorkflowPublishRequest,
            name=name,
            description=description,
            input_schema=dict(input_schema),
            output_schema=dict(output_schema) if output_schema is not None else None,
            definition=definition,
        )
        data = await self._tb.request(self._tb.subjects.workflows_publish, body, retry=True)
        return WorkflowPublishReply.model_validate(data).version

    async def get(self, name: str, version: str | None = None) -> Workflow:
        """One published version (the latest where `version` is None)."""
        body = build(WorkflowGetRequest, name=name, version=version)
        return Workflow.model_validate(
            await self._tb.request(self._tb.subjects.workflows_get, body, retry=True)
        )
