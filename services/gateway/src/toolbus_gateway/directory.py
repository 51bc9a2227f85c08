"""What a client reads of a toolset besides `tools/list`, answered by the registry: the namespace
catalogue (`toolsets.namespaces`) in `search_tools`' description, `search_tools`
(`toolsets.search`), `list_tools` (the catalogue, or one namespace's `toolsets.declarations`), and
the declarations as resources. A toolset id names content that never changes, so what is read is
cached by it."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote, unquote

import mcp_types as types
from toolbus_common.lru import Lru
from toolbus_contracts import Subjects
from toolbus_contracts.catalogue import SEARCH_INPUT, search_description
from toolbus_contracts.errors import ToolbusError
from toolbus_contracts.registry import NAMESPACES_MAX, DeclarationFormat, NamespaceInfo

from toolbus_gateway.calls import error_result, ok_result, refused_result
from toolbus_gateway.catalogue import Catalogue
from toolbus_gateway.requests import Requester

log = logging.getLogger(__name__)

SEARCH_TOOLS = "search_tools"
LIST_TOOLS = "list_tools"
CALL_TOOL = "call_tool"

LIST_INPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "namespace": {
            "type": "string",
            "minLength": 1,
            "description": "The namespace to list (a name from search_tools' description); "
            "absent: list the namespaces.",
        },
        "cursor": {"type": "string", "description": "nextCursor of the previous page."},
    },
    "additionalProperties": False,
}
CALL_INPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "description": "The tool's qualified name."},
        "arguments": {"type": "object", "description": "The tool's input.", "default": {}},
    },
    "required": ["name"],
    "additionalProperties": False,
}
LIST_TOOL = types.Tool(
    name=LIST_TOOLS,
    title="List tools",
    description=(
        "List the tools of one namespace (a name from search_tools' description), one line each: "
        "qualified name, input and what it does; without a namespace, list the namespaces. A page "
        "at a time: pass nextCursor as cursor for the next."
    ),
    input_schema=LIST_INPUT,
    annotations=types.ToolAnnotations(read_only_hint=True),
)
CALL_TOOL_TOOL = types.Tool(
    name=CALL_TOOL,
    title="Call a tool",
    description=(
        "Call one tool of this toolset by its qualified name (as search_tools or list_tools show "
        "it, e.g. github.list_issues) with its input as `arguments`."
    ),
    input_schema=CALL_INPUT,
)

DECLARATIONS: dict[str, tuple[DeclarationFormat, str, str]] = {
    "declarations.txt": ("prompt", "text/plain", "Tool declarations, one line per tool"),
    "declarations.d.ts": ("dts", "text/x-typescript", "Tool declarations, TypeScript"),
}
"""The declarations offered as resources, for the whole toolset and for each namespace."""


def declarations_uri(toolset_id: str, name: str, namespace: str | None = None) -> str:
    """`toolbus://toolsets/<id>/<name>`, or `…/namespaces/<namespace>/<name>` for one namespace."""
    if namespace is None:
        return f"toolbus://toolsets/{toolset_id}/{name}"
    return f"toolbus://toolsets/{toolset_id}/namespaces/{quote(namespace, safe='')}/{name}"


def _offset(cursor: Any, end: int) -> int | None:
    """The offset a cursor this listing gave names (None: not one)."""
    if cursor is None:
        return 0
    if not isinstance(cursor, str) or not cursor.isascii() or not cursor.isdigit() or int(cursor) >= end:
        return None
    return int(cursor)


class Directory:
    """The registry's views of toolsets for MCP clients, cached by toolset id."""

    def __init__(self, requester: Requester, subjects: Subjects, *, page_size: int) -> None:
        self._req = requester
        self._s = subjects
        self.page_size = page_size
        self._namespaces: Lru[str, tuple[NamespaceInfo, ...]] = Lru(64)
        self._lines: Lru[tuple[str, str], tuple[str, ...]] = Lru(256)

    async def namespaces(self, toolset_id: str) -> tuple[NamespaceInfo, ...]:
        """The toolset's namespace catalogue, every page of `toolsets.namespaces`."""
        hit = self._namespaces.get(toolset_id)
        if hit is not None:
            return hit
        found: list[NamespaceInfo] = []
        cursor: str | None = None
        while True:
            body: dict[str, Any] = {"id": toolset_id}
            if cursor is not None:
                body["cursor"] = cursor
            page = await self._req.request(self._s.toolsets_namespaces, body)
            found += [NamespaceInfo.model_validate(n) for n in page.get("namespaces", [])]
            cursor = page.get("nextCursor")
            if cursor is None:
                break
        namespaces = tuple(found)
        self._namespaces.put(toolset_id, namespaces)
        return namespaces

    async def declarations(
        self, toolset_id: str, fmt: DeclarationFormat, namespace: str | None = None
    ) -> str:
        """The toolset's (or one namespace's) declarations, every page of `toolsets.declarations` joined."""
        parts: list[str] = []
        cursor: str | None = None
        while True:
            body: dict[str, Any] = {"id": toolset_id, "format": fmt}
            if namespace is not None:
                body["namespace"] = namespace
            if cursor is not None:
                body["cursor"] = cursor
            page = await self._req.request(self._s.toolsets_declarations, body)
            parts.append(str(page["text"]))
            cursor = page.get("nextCursor")
            if cursor is None:
                return "".join(parts)

    # ---- the large-toolset mode ---------------------------------------------------------------

    async def _catalogue(self, toolset_id: str) -> tuple[NamespaceInfo, ...]:
        """`namespaces`, or none (logged) when the registry cannot be asked."""
        try:
            return await self.namespaces(toolset_id)
        except ToolbusError as exc:
            log.warning(
                "namespace catalogue not read", extra={"toolsetId": toolset_id, "error": exc.code.value}
            )
            return ()

    async def meta_tools(self, toolset_id: str) -> list[types.Tool]:
        """`search_tools` (its description carrying the namespace catalogue), `list_tools` and
        `call_tool`. Without the catalogue (the registry away) `search_tools` carries the guide
        alone: it still searches every namespace."""
        namespaces = await self._catalogue(toolset_id)
        search = types.Tool(
            name=SEARCH_TOOLS,
            title="Search tools",
            description=search_description(namespaces),
            input_schema=SEARCH_INPUT,
            annotations=types.ToolAnnotations(read_only_hint=True),
        )
        return [search, LIST_TOOL, CALL_TOOL_TOOL]

    async def search_tools(self, catalogue: Catalogue, arguments: dict[str, Any]) -> types.CallToolResult:
        """`search_tools`: `toolsets.search`, scoped to `namespaces` when given; each hit with its
        name, namespace, one-line declaration and input schema, best first."""
        query, limit, namespaces = (
            arguments.get("query"),
            arguments.get("limit", 5),
            arguments.get("namespaces"),
        )
        if not isinstance(query, str) or not query.strip():
            return error_result("invalidInput", "search_tools takes a 'query' (text).", {})
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 50:
            return error_result("invalidInput", "search_tools' 'limit' is an integer from 1 to 50.", {})
        if namespaces is not None and (
            not isinstance(namespaces, list)
            or len(namespaces) > NAMESPACES_MAX
            or not all(isinstance(n, str) and n for n in namespaces)
        ):
            return error_result(
                "invalidInput",
                f"search_tools' 'namespaces' is a list of up to {NAMESPACES_MAX} namespace names.",
                {},
            )
        body: dict[str, Any] = {"id": catalogue.toolset_id, "query": query, "limit": limit}
        if namespaces:
            body["namespaces"] = namespaces
        try:
            data = await self._req.request(self._s.toolsets_search, body)
        except ToolbusError as exc:
            return refused_result(exc, {})
        hits = [
            {
                "name": h["name"],
                "namespace": h["namespace"],
                "description": h["prompt"],
                "inputSchema": catalogue.schemas.get(h["name"], {}),
            }
            for h in data.get("tools", [])
        ]
        return ok_result({"tools": hits}, {})

    async def list_tools(self, toolset_id: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """`list_tools`: one namespace's tools as declaration lines, or (without a namespace) the
        namespaces, `page_size` a page."""
        namespace, cursor = arguments.get("namespace"), arguments.get("cursor")
        if namespace is not None and (not isinstance(namespace, str) or not namespace):
            return error_result("invalidInput", "list_tools' 'namespace' is a namespace's name.", {})
        try:
            if namespace is None:
                items: tuple[Any, ...] = tuple(
                    {"name": n.name, "kind": n.kind, "toolCount": n.tool_count, "summary": n.summary}
                    for n in await self.namespaces(toolset_id)
                )
            else:
                items = await self._namespace_lines(toolset_id, namespace)
        except ToolbusError as exc:
            return refused_result(exc, {})
        start = _offset(cursor, max(1, len(items)))
        if start is None:
            return error_result("invalidInput", "The cursor is not one list_tools gave.", {})
        end = start + self.page_size
        listed: dict[str, Any] = (
            {"namespaces": list(items[start:end])}
            if namespace is None
            else {"namespace": namespace, "tools": list(items[start:end])}
        )
        if end < len(items):
            listed["nextCursor"] = str(end)
        return ok_result(listed, {})

    async def _namespace_lines(self, toolset_id: str, namespace: str) -> tuple[str, ...]:
        hit = self._lines.get((toolset_id, namespace))
        if hit is not None:
            return hit
        text = await self.declarations(toolset_id, "prompt", namespace)
        lines = tuple(line for line in text.splitlines() if line.strip())
        self._lines.put((toolset_id, namespace), lines)
        return lines

    # ---- resources ----------------------------------------------------------------------------

    async def resources(self, toolset_id: str, cursor: str | None) -> tuple[list[types.Resource], str | None]:
        """A page of resources: the whole toolset's declarations, then each namespace's (the
        registry away: the whole toolset's only). A cursor this listing never gave is ValueError."""
        namespaces = await self._catalogue(toolset_id)
        out = [
            types.Resource(name=name, title=title, uri=declarations_uri(toolset_id, name), mime_type=mime)
            for name, (_, mime, title) in DECLARATIONS.items()
        ]
        for n in namespaces:
            out += [
                types.Resource(
                    name=f"{n.name}/{name}",
                    title=f"{title}: {n.name} ({n.tool_count} tools)",
                    description=n.summary,
                    uri=declarations_uri(toolset_id, name, n.name),
                    mime_type=mime,
                )
                for name, (_, mime, title) in DECLARATIONS.items()
            ]
        start = _offset(cursor, len(out))
        if start is None:
            raise ValueError("cursor")
        end = start + self.page_size
        return out[start:end], (str(end) if end < len(out) else None)

    def templates(self, toolset_id: str) -> list[types.ResourceTemplate]:
        """One namespace's declarations, by name."""
        return [
            types.ResourceTemplate(
                name=f"namespace/{name}",
                title=f"{title}, of one namespace",
                uri_template=f"toolbus://toolsets/{toolset_id}/namespaces/{{namespace}}/{name}",
                mime_type=mime,
            )
            for name, (_, mime, title) in DECLARATIONS.items()
        ]

    async def read(self, toolset_id: str, uri: str) -> types.TextResourceContents | None:
        """A declarations resource of this toolset; None for a URI it does not offer (a namespace
        the toolset does not have included)."""
        base = f"toolbus://toolsets/{toolset_id}/"
        if not uri.startswith(base):
            return None
        path = uri[len(base) :]
        namespace: str | None = None
        if path.startswith("namespaces/"):
            quoted, _, path = path[len("namespaces/") :].partition("/")
            namespace = unquote(quoted)
            if namespace not in {n.name for n in await self.namespaces(toolset_id)}:
                return None
        if path not in DECLARATIONS:
            return None
        fmt, mime, _ = DECLARATIONS[path]
        text = await self.declarations(toolset_id, fmt, namespace)
        return types.TextResourceContents(uri=uri, mime_type=mime, text=text)
