"""What the MCP endpoint does, apart from HTTP: who is calling, which tools it lists, and a
`tools/call` as a toolbus call in the right run, its outcome as an MCP result."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import mcp_types as types
from mcp.shared.exceptions import MCPError
from toolbus_contracts import Subjects
from toolbus_contracts.errors import NotFound, ToolbusError, UnknownTool

from toolbus_gateway.auth import Authenticator, Principal
from toolbus_gateway.calls import (
    Calls,
    Parked,
    Progress,
    error_result,
    ok_result,
    parked_message,
    parked_result,
    refused_result,
    result_meta,
)
from toolbus_gateway.catalogue import Catalogue, Catalogues
from toolbus_gateway.directory import CALL_TOOL, LIST_TOOLS, SEARCH_TOOLS, Directory
from toolbus_gateway.requests import Requester
from toolbus_gateway.runs import Runs

log = logging.getLogger(__name__)

Elicit = Callable[[str, str, str], Awaitable[bool]]
"""`elicit(message, url, elicitation_id)`: a URL-mode elicitation; True when the user accepted."""

RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


class Gateway:
    """The gateway's logic, shared by every connection."""

    def __init__(
        self,
        authenticator: Authenticator,
        catalogues: Catalogues,
        calls: Calls,
        runs: Runs,
        requester: Requester,
        subjects: Subjects,
        *,
        page_size: int,
        large_toolset: int,
        reconnect_url: str | None,
        authorization_servers: list[str],
    ) -> None:
        self._auth = authenticator
        self._catalogues = catalogues
        self._calls = calls
        self._runs = runs
        self.directory = Directory(requester, subjects, page_size=page_size)
        self.page_size = page_size
        self.large_toolset = large_toolset
        self._reconnect_url = reconnect_url
        self.authorization_servers = authorization_servers

    async def authenticate(self, authorization: str | None) -> Principal:
        return await self._auth.authenticate(authorization)

    async def catalogue(self, toolset_id: str) -> Catalogue | None:
        return await self._catalogues.get(toolset_id)

    async def list_tools(
        self, catalogue: Catalogue, cursor: str | None, *, search_mode: bool
    ) -> tuple[list[types.Tool], str | None]:
        """A page of `tools/list`: the toolset's tools, or in search mode the three meta tools.
        A cursor the listing never gave is ValueError."""
        if search_mode:
            if cursor is not None:
                raise ValueError("cursor")
            return await self.directory.meta_tools(catalogue.toolset_id), None
        return catalogue.page(cursor, self.page_size)

    async def call_tool(
        self,
        principal: Principal,
        catalogue: Catalogue,
        name: str,
        arguments: dict[str, Any],
        *,
        named_run: str | None,
        session: str | None,
        progress: Progress | None,
        search_mode: bool,
        elicit: Elicit | None = None,
    ) -> types.CallToolResult:
        """A `tools/call` through toolbus. An unknown tool is a JSON-RPC error (`INVALID_PARAMS`);
        every failure of the call itself, refused input included, is a tool error."""
        if search_mode and name in (SEARCH_TOOLS, LIST_TOOLS, CALL_TOOL):
            return await self._meta_tool(
                catalogue, name, arguments, principal, named_run, session, progress, elicit
            )
        if name not in catalogue.schemas:
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {name[:200]} is not in this toolset.")
        return await self._call(
            principal, catalogue.toolset_id, name, arguments, named_run, session, progress, elicit
        )

    async def _call(
        self,
        principal: Principal,
        toolset_id: str,
        name: str,
        arguments: dict[str, Any],
        named_run: str | None,
        session: str | None,
        progress: Progress | None,
        elicit: Elicit | None,
    ) -> types.CallToolResult:
        if named_run is not None and not RUN_ID.fullmatch(named_run):
            raise MCPError(types.INVALID_PARAMS, "The Mcp-Run header is not a run id ([A-Za-z0-9_-], 1-128).")
        binding = f"{principal.key}|session:{session}" if session else principal.key
        for attempt in (1, 2):
            try:
                if named_run is not None:
                    run_id = await self._runs.named(named_run, toolset_id, principal.namespace)
                else:
                    run_id = await self._runs.acquire(binding, toolset_id, principal.namespace)
            except ToolbusError as exc:
                return refused_result(exc, {})
            meta = result_meta(run_id, None)
            try:
                reply = await self._calls.invoke(run_id, name, arguments, progress)
            except NotFound:
                if named_run is None:
                    self._runs.forget(binding, toolset_id, run_id)
                if attempt == 1 and named_run is None:
                    continue  # the run was closed elsewhere: open a new one, once
                return error_result("notFound", f"Run {run_id} is closed.", meta)
            except Parked as parked:
                reconnect = self._reconnect(toolset_id, principal, name)
                meta = result_meta(run_id, parked.call_id)
                if reconnect is None or elicit is None:
                    return parked_result(parked.call_id, reconnect, meta)
                try:  # URL-mode elicitation: the user renews them there while the call waits
                    accepted = await elicit(
                        parked_message(parked.call_id, reconnect), reconnect, parked.call_id
                    )
                except Exception as exc:  # the client cannot answer it after all
                    log.info(
                        "elicitation failed", extra={"callId": parked.call_id, "error": type(exc).__name__}
                    )
                    accepted = False
                if not accepted:
                    return parked_result(parked.call_id, reconnect, meta)
                try:
                    reply = await self._calls.invoke(
                        run_id,
                        name,
                        arguments,
                        progress,
                        idempotency_key=parked.idempotency_key,
                        stop_when_parked=False,
                    )
                except ToolbusError as exc:
                    return refused_result(exc, meta)
            except UnknownTool as exc:
                raise MCPError(types.INVALID_PARAMS, exc.message) from None
            except ToolbusError as exc:
                return refused_result(exc, meta)
            finally:
                if named_run is None:
                    self._runs.release(binding, toolset_id)
            call_id = str(reply["callId"])
            meta = result_meta(run_id, call_id)
            outcome = reply["outcome"]
            if outcome.get("status") == "ok":
                try:
                    return ok_result(await self._calls.output(outcome, call_id), meta)
                except Exception as exc:
                    log.warning(
                        "stored output not read", extra={"callId": call_id, "error": type(exc).__name__}
                    )
                    return error_result(
                        "unavailable", f"The output of call {call_id} could not be read.", meta
                    )
            error = outcome.get("error") or {}
            return error_result(str(error.get("code", "internal")), str(error.get("message", "")), meta)
        raise AssertionError("unreachable")

    def _reconnect(self, toolset_id: str, principal: Principal, tool: str) -> str | None:
        """The reconnect URL with `{namespace}`, `{toolsetId}` and `{server}` (the MCP server of
        the tool: the part of its qualified name before the dot) filled in, URL-quoted."""
        if not self._reconnect_url:
            return None
        server = tool.split(".", 1)[0]
        filled = {"{namespace}": principal.namespace, "{toolsetId}": toolset_id, "{server}": server}
        url = self._reconnect_url
        for key, value in filled.items():
            url = url.replace(key, quote(value, safe=""))
        return url

    async def _meta_tool(
        self,
        catalogue: Catalogue,
        name: str,
        arguments: dict[str, Any],
        principal: Principal,
        named_run: str | None,
        session: str | None,
        progress: Progress | None,
        elicit: Elicit | None,
    ) -> types.CallToolResult:
        if name == SEARCH_TOOLS:
            return await self.directory.search_tools(catalogue, arguments)
        if name == LIST_TOOLS:
            return await self.directory.list_tools(catalogue.toolset_id, arguments)
        target, args = arguments.get("name"), arguments.get("arguments", {})
        if not isinstance(target, str) or not isinstance(args, dict):
            return error_result(
                "invalidInput", "call_tool takes a 'name' (string) and 'arguments' (object).", {}
            )
        if target not in catalogue.schemas:
            return error_result(
                "unknownTool", f"{target[:200]} is not in this toolset: search_tools finds tools.", {}
            )
        return await self._call(
            principal, catalogue.toolset_id, target, args, named_run, session, progress, elicit
        )
