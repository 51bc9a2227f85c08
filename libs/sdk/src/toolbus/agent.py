"""Tools for a model, answered by toolbus: `search_tools` (find tools of a toolset too large for the
prompt) and `call_tool` (call any tool of the run by its qualified name), as definitions in the
shapes of the main model APIs and with the handlers that answer them.

    agent = AgentTools(run)                          # a Run of the toolset
    request["tools"] = agent.anthropic()              # or .openai(), .mcp()
    reply_block = await agent.answer_anthropic(tool_use_block)

`answer_*` take the API's own tool-call object (an Anthropic `tool_use` block, an OpenAI
`tool_calls[]` item, MCP `tools/call` params) as a dict and return that API's result object. A
failed call is reported to the model as a result (`ok: false` with the code), not raised.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

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


SEARCH_TOOLS = ToolDefinition(
    name="search_tools",
    description=(
        "Search the tools available to you by what you want to do. Returns the best matching tools, "
        "best first, each with its qualified name and its TypeScript declaration (input and output "
        "types). Call one with call_tool, giving its name and an input of its input type."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "minLength": 1,
                "description": "What you want to do, in a few words.",
            },
            "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 5},
        },
        "required": ["query"],
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

DEFINITIONS = (SEARCH_TOOLS, CALL_TOOL)


class AgentTools:
    """The handlers of `search_tools` and `call_tool` for one run (its toolset is what is searched)."""

    def __init__(self, run: Run, *, style: Style = "dts", call_timeout: float | None = None) -> None:
        if run.toolset_id is None:
            raise ValueError("AgentTools needs a run opened with runs.open (its toolset id is known)")
        self.run = run
        self.toolset_id = run.toolset_id
        self.style = style
        self.call_timeout = call_timeout

    def anthropic(self) -> list[dict[str, Any]]:
        return [d.anthropic() for d in DEFINITIONS]

    def openai(self) -> list[dict[str, Any]]:
        return [d.openai() for d in DEFINITIONS]

    def mcp(self) -> list[dict[str, Any]]:
        return [d.mcp() for d in DEFINITIONS]

    async def handle(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Answer one call of `search_tools` or `call_tool`; the result is a JSON object."""
        try:
            if name == SEARCH_TOOLS.name:
                return await self._search(arguments)
            if name == CALL_TOOL.name:
                return await self._call(arguments)
        except ToolbusError as exc:
            return {"ok": False, "error": {"code": exc.code.value, "message": exc.message}}
        return {"ok": False, "error": {"code": "unknownTool", "message": f"No tool '{name}' here."}}

    async def _search(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        query = arguments.get("query")
        limit = arguments.get("limit", 5)
        if not isinstance(query, str) or not query.strip():
            return {
                "ok": False,
                "error": {"code": "invalidInput", "message": "query must be a non-empty string"},
            }
        if not isinstance(limit, int) or isinstance(limit, bool):
            return {"ok": False, "error": {"code": "invalidInput", "message": "limit must be an integer"}}
        hits = await self.run._tb.toolsets.search(self.toolset_id, query, limit=max(1, min(50, limit)))
        return {
            "ok": True,
            "tools": [
                {"name": h.name, "declaration": h.dts if self.style == "dts" else h.prompt, "score": h.score}
                for h in hits
            ],
        }

    async def _call(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        tool = arguments.get("name")
        tool_input = arguments.get("input", {})
        if not isinstance(tool, str) or not tool:
            return {
                "ok": False,
                "error": {"code": "invalidInput", "message": "name must be a tool's qualified name"},
            }
        if not isinstance(tool_input, Mapping):
            return {"ok": False, "error": {"code": "invalidInput", "message": "input must be an object"}}
        result = await self.run.invoke(tool, tool_input, timeout=self.call_timeout)
        if result.error is not None:
            return {"ok": False, "error": {"code": result.error.code.value, "message": result.error.message}}
        return {"ok": True, "output": result.output}

    # ---- each API's own shapes ----------------------------------------------------------------

    async def answer_anthropic(self, tool_use: Mapping[str, Any]) -> dict[str, Any]:
        """A `tool_use` content block -> its `tool_result` block (content: the JSON text)."""
        result = await self.handle(str(tool_use.get("name")), tool_use.get("input") or {})
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": tool_use.get("id"),
            "content": json.dumps(result),
        }
        if not result.get("ok"):
            block["is_error"] = True
        return block

    async def answer_openai(self, tool_call: Mapping[str, Any]) -> dict[str, Any]:
        """A `tool_calls[]` item (`arguments` a JSON string) -> the `role: tool` message."""
        function = tool_call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            result: dict[str, Any] = {
                "ok": False,
                "error": {"code": "invalidInput", "message": "arguments must be a JSON object"},
            }
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
