"""Tools for a model, answered by toolbus: `search_tools` (find tools of a toolset too large for the
prompt, scoped to the namespaces the model picks from the catalogue in its description),
`list_tools` (read one namespace's tools) and `call_tool` (call any tool of the run by its
qualified name), as definitions in the shapes of the main model APIs and with the handlers that
answer them.

    agent = await AgentTools.open(run)                # a Run of the toolset; reads its catalogue
    request["tools"] = agent.anthropic()              # or .openai(), .mcp()
    reply_block = await agent.answer_anthropic(tool_use_block)

`answer_*` take the API's own tool-call object (an Anthropic `tool_use` block, an OpenAI
`tool_calls[]` item, MCP `tools/call` params) as a dict and return that API's result object. A
failed call is reported to the model as a result (`ok: false` with the code), not raised.

`DeferredTools` gives the providers' own deferred loading instead: every tool of the toolset
with `defer_loading`, found by toolbus's search (Anthropic: a custom search tool answering with
`tool_reference` blocks; OpenAI Responses: namespaces of deferred functions with `tool_search`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from toolbus_contracts.catalogue import CATALOGUE_CHARS as CATALOGUE_CHARS
from toolbus_contracts.catalogue import SEARCH_GUIDE as SEARCH_GUIDE
from toolbus_contracts.catalogue import SEARCH_INPUT, namespace_line, search_description
from toolbus_contracts.catalogue import catalogue_text as catalogue_text
from toolbus_contracts.registry import NamespaceInfo

from toolbus._errors import ToolbusError

if TYPE_CHECKING:
    from toolbus._runs import Run

Style = Literal["dts", "prompt"]


@dataclass(frozen=True)
class ToolDefinition:
    """One tool for a model: name, description and JSON Schema of its input."""

    name: str
    description: str
    input_schema: dict[str, Any]

    def anthropic(self) -> dict[str, Any]:
        """Anthropic Messages API `tools[]` entry."""
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}

    def openai(self) -> dict[str, Any]:
        """OpenAI Chat Completions `tools[]` entry (function calling)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.input_schema},
        }

    def mcp(self) -> dict[str, Any]:
        """MCP `Tool` (as `tools/list` lists it)."""
        return {"name": self.name, "description": self.description, "inputSchema": self.input_schema}


SEARCH_TOOLS = ToolDefinition(name="search_tools", description=SEARCH_GUIDE, input_schema=SEARCH_INPUT)

LIST_PAGE_LINES = 60
"""Tools one `list_tools` page shows."""

LIST_TOOLS = ToolDefinition(
    name="list_tools",
    description=(
        "List the tools of one namespace (a name from search_tools' description), one line each: "
        "qualified name, input and what it does. Without a namespace, list every namespace with "
        "its kind, tool count and whole summary. Long lists come in pages of "
        f"{LIST_PAGE_LINES}; ask for the next with `page`."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "namespace": {
                "type": "string",
                "minLength": 1,
                "description": "The namespace to list; leave it out to list the namespaces.",
            },
            "page": {"type": "integer", "minimum": 1, "default": 1},
        },
        "additionalProperties": False,
    },
)

CALL_TOOL = ToolDefinition(
    name="call_tool",
    description=(
        "Call one tool by its qualified name (as search_tools shows it, e.g. github.list_issues) with "
        "its input. Returns {ok: true, output} or {ok: false, error: {code, message}}."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "description": "The tool's qualified name."},
            "input": {"type": "object", "description": "The tool's input.", "default": {}},
        },
        "required": ["name"],
        "additionalProperties": False,
    },
)

DEFINITIONS = (SEARCH_TOOLS, LIST_TOOLS, CALL_TOOL)


def _error(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error": {"code": code, "message": message}}


def _tool_result(tool_use: Mapping[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """The Anthropic `tool_result` block answering `tool_use` with `result` as JSON text."""
    block: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": tool_use.get("id"),
        "content": json.dumps(result),
    }
    if not result.get("ok"):
        block["is_error"] = True
    return block


class AgentTools:
    """The handlers of `search_tools`, `list_tools` and `call_tool` for one run (its toolset is
    what is searched). `catalogue`: the toolset's namespaces, shown in `search_tools`'
    description (`open` reads them)."""

    def __init__(
        self,
        run: Run,
        *,
        style: Style = "dts",
        call_timeout: float | None = None,
        catalogue: Sequence[NamespaceInfo] = (),
        catalogue_chars: int = CATALOGUE_CHARS,
    ) -> None:
        if run.toolset_id is None:
            raise ValueError("AgentTools needs a run opened with runs.open (its toolset id is known)")
        self.run = run
        self.toolset_id = run.toolset_id
        self.style = style
        self.call_timeout = call_timeout
        self.catalogue = tuple(catalogue)
        self._namespaces = frozenset(n.name for n in self.catalogue)
        search = replace(SEARCH_TOOLS, description=search_description(self.catalogue, catalogue_chars))
        self.definitions: tuple[ToolDefinition, ...] = (search, LIST_TOOLS, CALL_TOOL)
        self._listed: dict[str, list[str]] = {}

    @classmethod
    async def open(cls, run: Run, **options: Any) -> AgentTools:
        """The agent tools of a run, with its toolset's namespace catalogue read first."""
        if run.toolset_id is None:
            raise ValueError("AgentTools needs a run opened with runs.open (its toolset id is known)")
        return cls(run, catalogue=await run.toolsets.namespaces(run.toolset_id), **options)

    def anthropic(self) -> list[dict[str, Any]]:
        return [d.anthropic() for d in self.definitions]

    def openai(self) -> list[dict[str, Any]]:
        return [d.openai() for d in self.definitions]

    def mcp(self) -> list[dict[str, Any]]:
        return [d.mcp() for d in self.definitions]

    async def handle(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Answer one call of `search_tools`, `list_tools` or `call_tool`; the result is a JSON
        object."""
        try:
            if name == SEARCH_TOOLS.name:
                return await self._search(arguments)
            if name == LIST_TOOLS.name:
                return await self._list(arguments)
            if name == CALL_TOOL.name:
                return await self._call(arguments)
        except ToolbusError as exc:
            return _error(exc.code.value, exc.message)
        return _error("unknownTool", f"No tool '{name}' here.")

    async def _search(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        query = arguments.get("query")
        limit = arguments.get("limit", 5)
        namespaces = arguments.get("namespaces")
        if not isinstance(query, str) or not query.strip():
            return _error("invalidInput", "query must be a non-empty string")
        if not isinstance(limit, int) or isinstance(limit, bool):
            return _error("invalidInput", "limit must be an integer")
        if namespaces is not None and (
            not isinstance(namespaces, list) or not all(isinstance(n, str) and n for n in namespaces)
        ):
            return _error("invalidInput", "namespaces must be a list of namespace names")
        if isinstance(namespaces, list) and not namespaces:
            namespaces = None
        reply = await self.run.toolsets.search_reply(
            self.toolset_id, query, limit=max(1, min(50, limit)), namespaces=namespaces
        )
        return {
            "ok": True,
            "tools": [
                {
                    "name": h.name,
                    "namespace": h.namespace,
                    "declaration": h.dts if self.style == "dts" else h.prompt,
                    "score": h.score,
                }
                for h in reply.tools
            ],
            "ranking": reply.ranking,
        }

    async def _list(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        namespace = arguments.get("namespace")
        page = arguments.get("page", 1)
        if namespace is not None and (not isinstance(namespace, str) or not namespace):
            return _error("invalidInput", "namespace must be a namespace's name")
        if not isinstance(page, int) or isinstance(page, bool) or page < 1:
            return _error("invalidInput", "page must be an integer from 1")
        if namespace is None:
            lines = [namespace_line(n)[2:] for n in self.catalogue]
        else:
            found = self._listed.get(namespace)
            if found is None:
                text = await self.run.toolsets.declarations(self.toolset_id, "prompt", namespace=namespace)
                found = [line for line in text.splitlines() if line.strip()]
                self._listed[namespace] = found
            lines = found
        pages = max(1, -(-len(lines) // LIST_PAGE_LINES))
        if page > pages:
            what = f"namespace '{namespace}'" if namespace is not None else "the namespace list"
            return _error("invalidInput", f"{what} has {pages} page(s)")
        shown = lines[(page - 1) * LIST_PAGE_LINES : page * LIST_PAGE_LINES]
        if namespace is None:
            return {"ok": True, "page": page, "pages": pages, "namespaces": shown}
        return {"ok": True, "namespace": namespace, "page": page, "pages": pages, "tools": shown}

    async def _call(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        tool = arguments.get("name")
        tool_input = arguments.get("input", {})
        if not isinstance(tool, str) or not tool:
            return _error("invalidInput", "name must be a tool's qualified name")
        if not isinstance(tool_input, Mapping):
            return _error("invalidInput", "input must be an object")
        result = await self.run.invoke(tool, tool_input, timeout=self.call_timeout)
        if result.error is not None:
            return _error(result.error.code.value, result.error.message)
        return {"ok": True, "output": result.output}

    # ---- each API's own shapes ----------------------------------------------------------------

    async def answer_anthropic(self, tool_use: Mapping[str, Any]) -> dict[str, Any]:
        """A `tool_use` content block -> its `tool_result` block (content: the JSON text)."""
        result = await self.handle(str(tool_use.get("name")), tool_use.get("input") or {})
        return _tool_result(tool_use, result)

    async def answer_openai(self, tool_call: Mapping[str, Any]) -> dict[str, Any]:
        """A `tool_calls[]` item (`arguments` a JSON string) -> the `role: tool` message."""
        function = tool_call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            result = _error("invalidInput", "arguments must be a JSON object")
        else:
            result = await self.handle(str(function.get("name")), arguments)
        return {"role": "tool", "tool_call_id": tool_call.get("id"), "content": json.dumps(result)}

    async def answer_mcp(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """MCP `tools/call` params -> a `CallToolResult` (text and `structuredContent`)."""
        result = await self.handle(str(params.get("name")), params.get("arguments") or {})
        return {
            "content": [{"type": "text", "text": json.dumps(result)}],
            "structuredContent": result,
            "isError": not result.get("ok"),
        }


# ---- the providers' own deferred loading ------------------------------------------------------

_API_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]")


def api_name(name: str) -> str:
    """`name` as the Anthropic and OpenAI APIs take a tool's name (`^[A-Za-z0-9_-]{1,64}$`):
    dots as `__`, other characters as `_`, and a longer name cut with a hash of the whole."""
    out = _NOT_NAME.sub("_", name.replace(".", "__"))
    if _API_NAME.fullmatch(out):
        return out
    return f"{out[:55]}_{hashlib.blake2s(name.encode(), digest_size=4).hexdigest()}"


@dataclass(frozen=True)
class _Deferred:
    qualified: str
    namespace: str
    local: str
    """The tool's name inside its namespace, in API form (OpenAI's namespaced functions)."""
    definition: ToolDefinition
    """Named in API form (`api_name` of the qualified name)."""


class DeferredTools:
    """Every tool of a run's toolset for the providers' deferred loading, found by toolbus's
    search: the model sees only the search tool (its description carries the catalogue) until a
    search loads the tools it needs, then calls them by name.

    Anthropic Messages (tool search): `anthropic()` is the `tools` list, every toolset tool with
    `defer_loading: true`; `answer_anthropic` answers `search_tools` with `tool_reference` blocks
    and a call of a loaded tool with its result.
    OpenAI Responses (tool search): `openai_responses()` is the `tools` list, a client-executed
    `tool_search` and one `namespace` of deferred functions per toolset namespace;
    `answer_openai_tool_search` answers a `tool_search_call` item with the `tool_search_output`
    item of the hits, `answer_openai_function_call` a `function_call` item."""

    def __init__(self, agent: AgentTools, tools: Sequence[Any]) -> None:
        self.agent = agent
        self._by_api: dict[str, _Deferred] = {}
        self._by_qualified: dict[str, _Deferred] = {}
        for tool in tools:
            namespace, dot, local = tool.name.partition(".")
            entry = _Deferred(
                qualified=tool.name,
                namespace=namespace,
                local=api_name(local if dot else tool.name),
                definition=ToolDefinition(
                    api_name(tool.name), tool.description or tool.name, tool.input_schema
                ),
            )
            self._by_api[entry.definition.name] = entry
            self._by_qualified[tool.name] = entry
        self._by_namespace_local = {(e.namespace, e.local): e for e in self._by_api.values()}
        self._namespaces = {api_name(e.namespace): e.namespace for e in self._by_api.values()}
        """Namespace names in API form -> as the toolset names them."""

    @classmethod
    async def open(cls, run: Run, **options: Any) -> DeferredTools:
        """The deferred tools of a run: its toolset's catalogue and every tool read first."""
        agent = await AgentTools.open(run, **options)
        toolset = await run.toolsets.get(agent.toolset_id)
        return cls(agent, toolset.tools)

    @property
    def search(self) -> ToolDefinition:
        """The search tool (its description carries the catalogue)."""
        return self.agent.definitions[0]

    def qualified(self, name: str, namespace: str | None = None) -> str | None:
        """The qualified name of a tool as the API names it (with OpenAI's `namespace`)."""
        entry = self._by_namespace_local.get((namespace, name)) if namespace else self._by_api.get(name)
        return entry.qualified if entry is not None else None

    # Anthropic ---------------------------------------------------------------------------------

    def anthropic(self) -> list[dict[str, Any]]:
        """The Messages API `tools`: the search tool, then every tool with `defer_loading`."""
        deferred = [{**e.definition.anthropic(), "defer_loading": True} for e in self._by_api.values()]
        return [self.search.anthropic(), *deferred]

    async def answer_anthropic(self, tool_use: Mapping[str, Any]) -> dict[str, Any]:
        """A `tool_use` block -> its `tool_result`: for `search_tools`, `tool_reference` blocks of
        the hits (the API loads those tools); for a loaded tool, its result as JSON text."""
        name = str(tool_use.get("name"))
        arguments = tool_use.get("input") or {}
        if name == self.search.name:
            result = await self.agent.handle(name, arguments)
            if result.get("ok"):
                refs = [
                    {"type": "tool_reference", "tool_name": self._by_qualified[t["name"]].definition.name}
                    for t in result["tools"]
                    if t["name"] in self._by_qualified
                ]
                if refs:
                    return {"type": "tool_result", "tool_use_id": tool_use.get("id"), "content": refs}
                result = _error("noMatch", "No tool matched; search again with other words or namespaces.")
        else:
            qualified = self.qualified(name)
            result = (
                await self.agent.handle(CALL_TOOL.name, {"name": qualified, "input": arguments})
                if qualified is not None
                else _error("unknownTool", f"No tool '{name}' here.")
            )
        return _tool_result(tool_use, result)

    # OpenAI Responses --------------------------------------------------------------------------

    def _namespace(self, namespace: str, entries: Sequence[_Deferred]) -> dict[str, Any]:
        summary = next((n.summary for n in self.agent.catalogue if n.name == namespace), namespace)
        return {
            "type": "namespace",
            "name": api_name(namespace),
            "description": summary,
            "tools": [
                {
                    "type": "function",
                    "name": e.local,
                    "description": e.definition.description,
                    "parameters": e.definition.input_schema,
                    "defer_loading": True,
                }
                for e in entries
            ],
        }

    def _grouped(self, entries: Sequence[_Deferred]) -> list[dict[str, Any]]:
        groups: dict[str, list[_Deferred]] = {}
        for e in entries:
            groups.setdefault(e.namespace, []).append(e)
        return [self._namespace(ns, group) for ns, group in groups.items()]

    def openai_responses(self) -> list[dict[str, Any]]:
        """The Responses API `tools`: a client-executed `tool_search` (toolbus's search, its
        description carrying the catalogue) and every tool, deferred, in its namespace."""
        search = {
            "type": "tool_search",
            "execution": "client",
            "description": self.search.description,
            "parameters": self.search.input_schema,
        }
        return [search, *self._grouped(list(self._by_api.values()))]

    async def answer_openai_tool_search(self, call: Mapping[str, Any]) -> dict[str, Any]:
        """A `tool_search_call` item -> the `tool_search_output` item loading the hits (none when
        the search failed or found nothing)."""
        arguments = call.get("arguments")
        result = await self.agent.handle(
            self.search.name, arguments if isinstance(arguments, Mapping) else {}
        )
        found = [
            self._by_qualified[t["name"]] for t in result.get("tools", []) if t["name"] in self._by_qualified
        ]
        return {
            "type": "tool_search_output",
            "call_id": call.get("call_id"),
            "execution": "client",
            "tools": self._grouped(found),
        }

    async def answer_openai_function_call(self, call: Mapping[str, Any]) -> dict[str, Any]:
        """A `function_call` item (with its `namespace`) -> the `function_call_output` item."""
        try:
            arguments = json.loads(call.get("arguments") or "{}")
        except json.JSONDecodeError:
            arguments = None
        namespace = call.get("namespace")
        qualified = self.qualified(
            str(call.get("name")), self._namespaces.get(namespace) if isinstance(namespace, str) else None
        )
        if not isinstance(arguments, dict):
            result = _error("invalidInput", "arguments must be a JSON object")
        elif qualified is None:
            result = _error("unknownTool", f"No tool '{call.get('name')}' here.")
        else:
            result = await self.agent.handle(CALL_TOOL.name, {"name": qualified, "input": arguments})
        return {"type": "function_call_output", "call_id": call.get("call_id"), "output": json.dumps(result)}
