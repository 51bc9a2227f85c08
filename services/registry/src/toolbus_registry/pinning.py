"""Turn a toolset spec into a pinned toolset: check every contract rule, list MCP servers
concurrently, pin what they list, and compute the content-addressed id.

No NATS here: listing goes through an injected `ToolLister`, workflows and bases through injected
lookups, so the rules are unit-tested without a broker.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Protocol
from urllib.parse import urlsplit

import orjson
from pydantic import ValidationError
from toolbus_common.canonical import (
    canonical_array,
    canonical_json,
    canonical_members,
    content_id,
    json_safe,
    numbers_exact,
)
from toolbus_common.egress import EgressPolicy
from toolbus_common.lru import Lru
from toolbus_common.toolsets import mcp_tool_name, qualified_names
from toolbus_contracts import (
    ApprovalRule,
    EffectivePolicy,
    HttpSpec,
    McpServerSpec,
    PinnedServer,
    PinnedToolset,
    PinnedWorkflow,
    PolicySpec,
    ToolsetCreateRequest,
    Workflow,
)
from toolbus_contracts.base import SCHEMA_DEPTH_MAX, bounded, nesting_depth
from toolbus_contracts.errors import HostNotAllowed, InvalidRequest, NotFound
from toolbus_contracts.names import TOOL_NAME_MAX, normalize_allow_entry, split_allow_entry
from toolbus_contracts.registry import ABOUT_MAX, WORKFLOW_REF, ToolKind

_PINNED_TOOL_FIELDS = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")


@dataclass(frozen=True, slots=True)
class ServerListing:
    """What registration reads of an MCP server: its tools (wire form) and what it says of
    itself (its `instructions`, else its title or description; None when it says nothing)."""

    tools: list[dict[str, Any]]
    about: str | None = None


class ToolLister(Protocol):
    """Lists every tool of one MCP server (all pages) with the given headers."""

    async def __call__(self, server: str, url: str, headers: Mapping[str, str]) -> ServerListing: ...


WorkflowLookup = Callable[[str, str | None], Awaitable[Workflow | None]]
ToolsetLookup = Callable[[str], Awaitable[PinnedToolset | None]]


def toolset_id(pinned: PinnedToolset) -> str:
    """The id of a pinned toolset: what `Pinned.id` gives for it."""
    return content_id("ts_", pinned.wire())


def check_json_schema(schema: dict[str, Any], field: str) -> None:
    """Refuse a schema that is not valid JSON Schema (2020-12 unless it names its `$schema`).
    jsonschema is imported here, on the first host tool or workflow: ~2.4 MiB of RSS a registry
    whose toolsets are MCP servers only never needs."""
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import Draft202012Validator, validator_for

    if nesting_depth(schema) > SCHEMA_DEPTH_MAX:
        raise InvalidRequest(
            f"Field '{field}' nests deeper than {SCHEMA_DEPTH_MAX} levels of objects and arrays, "
            "the most toolbus checks.",
            details={"field": field, "limit": SCHEMA_DEPTH_MAX},
        )
    cls = validator_for(schema, default=Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        where = bounded("/".join(str(p) for p in exc.absolute_path) or "(root)", 200)
        raise InvalidRequest(  # bounded: a schema's keys and values may be huge
            f"Field '{field}' is not a valid JSON Schema at {where}: {bounded(exc.message, 300)}.",
            details={"field": field},
        ) from None


def _check_rule(policy: PolicySpec | None, field: str) -> None:
    """Refuse an approval rule whose `when` is not valid JSON Schema."""
    if policy is not None and isinstance(policy.approval, ApprovalRule):
        check_json_schema(policy.approval.when, f"{field}.approval.when")


def _normalise_policy(kind: ToolKind, spec: PolicySpec | None) -> PolicySpec | None:
    """Drop fields equal to the kind's default, so spelling out a default does not change the id."""
    if spec is None:
        return None
    effective = EffectivePolicy.for_kind(kind, spec).model_dump()
    default = EffectivePolicy.for_kind(kind, None).model_dump()
    kept = {k: v for k, v in effective.items() if v != default[k]}
    return PolicySpec.model_validate(kept) if kept else None


def _writable(value: Any) -> Any:
    """`value` as orjson can store and send it (see `json_safe`); itself in the common case."""
    try:
        orjson.dumps(value)
    except TypeError:
        return json_safe(value)
    return value


def _pin_tool(raw: dict[str, Any], listing: dict[str, str]) -> dict[str, Any]:
    """The pinned fields of a listed tool, as the wire form of a `PinnedTool` (the server's
    `PinnedServer` validates them all in one go). `listing`: the error details naming the server."""
    data = {k: raw[k] for k in _PINNED_TOOL_FIELDS if raw.get(k) is not None}
    if not isinstance(data.get("name"), str) or not isinstance(data.get("inputSchema"), dict):
        raise InvalidRequest(
            f"Server '{listing['server']}' listed a tool without a name or inputSchema.", details=listing
        )
    return data


@dataclass(frozen=True, slots=True)
class Pinned:
    """A pinned toolset, its wire form and that form's RFC 8785 canonical JSON (what the id is
    computed over, and what the store holds: `stored_json`)."""

    toolset: PinnedToolset
    wire: dict[str, Any]
    canonical: bytes

    @property
    def id(self) -> str:
        """`ts_` + SHA-256 of the canonical JSON of the normalised pinned toolset."""
        return "ts_" + hashlib.sha256(self.canonical).hexdigest()

    def stored_json(self) -> bytes:
        """What the toolset store holds: the canonical JSON (no second serialisation), unless JCS
        wrote an integer in it as the double it rounds to; then the wire form, whose numbers are
        exact, so a dispatcher reading the toolset validates against the schema as listed."""
        return self.canonical if numbers_exact(self.canonical) else orjson.dumps(self.wire)


def _pinned_server(data: dict[str, Any], listing: dict[str, str]) -> PinnedServer:
    try:
        return PinnedServer.model_validate(data, by_alias=True)
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in error["loc"])
        raise InvalidRequest(
            f"Server '{listing['server']}' listed a tool that cannot be pinned: {where}: {error['msg']}.",
            details=listing,
        ) from None


@dataclass(frozen=True, slots=True)
class ServerPin:
    """One MCP server pinned: the model, its wire form and that form's canonical JSON."""

    model: PinnedServer
    wire: dict[str, Any]
    canonical: bytes


SERVER_MEMO_BYTES = 32 * 1024 * 1024
"""Pinned servers remembered by what they listed (keyed by a 256-bit hash of the listing's own
bytes, not the bytes: 1.9 MiB less for the 1,350-tool corpus), up to this many bytes of their
canonical pinned JSON (each also keeps its pinned model and wire form, ~3x that)."""


TOOL_INFO_ROOM = 1024
"""Bytes a tool's `toolsets.get` form adds to its pinned form (kind, policy, qualified name)."""


def _check_tool_size(wire: dict[str, Any], limit: int, field: str, **named: str) -> None:
    """Refuse a tool too large for one `toolsets.get` page: it could be pinned, never read back."""
    size = len(orjson.dumps(wire))
    if size > limit:
        name = bounded(str(wire["name"]))
        raise InvalidRequest(
            f"Tool '{name}' is {size} bytes pinned, over the {limit} one toolsets.get page "
            "carries: make its description or schemas smaller.",
            details={"field": field, **named, "tool": name, "size": size, "limit": limit},
        )


def _pin_server(
    i: int, server: McpServerSpec, listed: list[dict[str, Any]], about: str | None, tool_limit: int
) -> ServerPin:
    listing = {"field": f"mcp[{i}].url", "server": server.name}  # what listed the tools
    tools = sorted((_pin_tool(t, listing) for t in listed), key=itemgetter("name"))
    names = {t["name"] for t in tools}
    if len(names) != len(tools):
        raise InvalidRequest(f"Server '{server.name}' lists two tools with the same name.", details=listing)
    for name in (t["name"] for t in tools):  # sorted: the first too long is the one named
        if len(mcp_tool_name(server.name, name)) > TOOL_NAME_MAX:
            shown = bounded(name, 200)
            raise InvalidRequest(
                f"Server '{server.name}' lists tool '{shown}', whose name '{server.name}.…' is over the "
                f"{TOOL_NAME_MAX} characters a call may name.",
                details={**listing, "tool": shown, "limit": TOOL_NAME_MAX},
            )
    for key in server.policies:
        if key not in names:
            shown = bounded(key, 200)
            raise InvalidRequest(
                f"Policy for '{shown}' on server '{server.name}': the server lists no such tool.",
                details={"field": f"mcp[{i}].policies.{shown}", "server": server.name, "tool": shown},
            )
    policies = {
        k: p for k, v in sorted(server.policies.items()) if (p := _normalise_policy("mcp", v)) is not None
    }
    said: dict[str, str] = {}
    if about:
        said["about"] = about[:ABOUT_MAX]
    if server.description is not None:
        said["description"] = server.description
    model = _pinned_server(
        {"name": server.name, "url": server.url, "tools": tools, "policies": policies, **said}, listing
    )
    wire = {
        "name": server.name,
        "url": server.url,
        "tools": tools,  # each already the wire form of its PinnedTool
        "policies": {k: p.wire() for k, p in policies.items()},
        **said,  # absent when not given: a toolset pinned before these fields keeps its id
    }
    canonical = canonical_json(wire)
    if len(canonical) > tool_limit:  # only then can one of its tools be too large
        for tool in tools:
            _check_tool_size(tool, tool_limit, f"mcp[{i}]", server=server.name)
    return ServerPin(model, wire, canonical)


URL_MAX = 2048
"""Longest MCP server URL taken (what browsers and most servers take at most)."""

_URL_UNSAFE = re.compile(r"[\x00-\x20\x7f]")


def url_problem(url: str) -> str | None:
    """Why `url` cannot be an MCP server's address (None when it can): http or https with a host,
    a port that is a number, no user info, no whitespace or control characters, at most `URL_MAX`
    characters."""
    if len(url) > URL_MAX:
        return f"it is longer than {URL_MAX} characters"
    if _URL_UNSAFE.search(url):
        return "it holds whitespace or a control character"
    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed or malformed `[...]` IPv6 literal
        return "its host is not a valid IPv6 literal"
    try:
        parts.port  # noqa: B018 - raises for a port that is not a number in range
    except ValueError:
        return "its port is not a number from 0 to 65535"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "it must be an http or https URL"
    if "@" in parts.netloc:
        # A password there would be pinned, hashed into the id and stored in the clear.
        return "it holds user info (user:password@); give the server's credentials in 'credentials'"
    return None


def egress_refused(field: str, what: str, reason: str, **named: str) -> InvalidRequest:
    """`invalidRequest` naming the field whose host the deployment's egress policy refuses; the
    same whether or not something listens there (nothing was sent to find out)."""
    return InvalidRequest(
        f"Field '{field}' {what}names a host the deployment does not let toolbus reach: {reason.rstrip('.')} "
        "(the operator's TOOLBUS_EGRESS_ALLOW).",
        details={"field": field, **named},
    )


class Pinner:
    """Builds pinned toolsets from specs under every rule of the contract's Registry section."""

    def __init__(
        self,
        lister: ToolLister,
        workflows: WorkflowLookup,
        toolsets: ToolsetLookup,
        *,
        page_bytes: int,
        egress: EgressPolicy | None = None,
    ) -> None:
        """`page_bytes`: what one `toolsets.get` page carries; no tool may be larger. `egress`:
        the deployment's egress policy (default: public addresses only), which every MCP URL and
        `http.allow` entry is checked against before anything is listed."""
        self._egress = egress or EgressPolicy()
        self._tool_limit = page_bytes - TOOL_INFO_ROOM
        self._list = lister
        self._workflow = workflows
        self._toolset = toolsets
        self._memo: Lru[bytes, ServerPin] = Lru(SERVER_MEMO_BYTES, weight=lambda _, pin: len(pin.canonical))

    async def pin(
        self, spec: ToolsetCreateRequest, on_pinned: Callable[[PinnedServer], None] | None = None
    ) -> Pinned:
        """The pinned toolset of a spec. Its wire form is assembled from the listed tools as they
        are checked, so a 1,000-tool toolset is not serialised again to compute its id.
        `on_pinned` is called with each server pinned afresh (not one remembered from an earlier
        listing of the same tools), as soon as it is, while others may still be listed."""
        if spec.base is not None:
            derived = await self._derive(spec)
            wire = orjson.loads(derived.wire_json())
            return Pinned(derived, wire, canonical_json(wire))
        self._check_names(spec)
        servers, workflows = await asyncio.gather(
            self._pin_servers(spec, on_pinned), self._pin_workflows(spec.workflows)
        )
        host = sorted(
            (
                h.model_copy(
                    update={
                        "policy": _normalise_policy("host", h.policy),
                        "input_schema": _writable(h.input_schema),
                        "output_schema": _writable(h.output_schema),
                    }
                )
                for h in spec.host
            ),
            key=lambda h: h.name,
        )
        http = None
        if spec.http is not None:
            http = HttpSpec(
                allow=sorted({normalize_allow_entry(a) for a in spec.http.allow}),
                policy=_normalise_policy("http", spec.http.policy),
            )
        pinned = PinnedToolset(servers=[s.model for s in servers], host=host, http=http, workflows=workflows)
        _check_unique_tools(pinned, spec)
        rest: dict[str, Any] = {
            "host": [h.wire() for h in host],
            "workflows": [w.wire() for w in workflows],
        }
        given = {h.name: i for i, h in enumerate(spec.host)}
        for tool in rest["host"]:
            _check_tool_size(tool, self._tool_limit, f"host[{given[tool['name']]}]")
        if http is not None:
            rest["http"] = http.wire()
        canonical = canonical_members(
            {k: canonical_json(v) for k, v in rest.items()}
            | {"servers": canonical_array([s.canonical for s in servers])}
        )
        return Pinned(pinned, {"servers": [s.wire for s in servers], **rest}, canonical)

    async def _derive(self, spec: ToolsetCreateRequest) -> PinnedToolset:
        for field in ("mcp", "host"):
            if getattr(spec, field):
                raise InvalidRequest(
                    f"Field '{field}' must be absent or empty with 'base': a derived toolset keeps the base's.",
                    details={"field": field},
                )
        if spec.http is not None:
            # Even one that allows nothing: on a first registration that is an `http.fetch` that
            # fetches nothing, so taking it as "empty" here would silently keep the base's.
            raise InvalidRequest(
                "Field 'http' must be absent with 'base': a derived toolset keeps the base's.",
                details={"field": "http"},
            )
        assert spec.base is not None
        base = await self._toolset(spec.base)
        if base is None:
            raise NotFound(f"Base toolset '{spec.base}' is not registered.", details={"field": "base"})
        _check_credential_servers(spec, {s.name for s in base.servers})
        added = await self._pin_workflows(spec.workflows)
        merged = {w.name: w for w in base.workflows} | {w.name: w for w in added}
        pinned = base.model_copy(update={"workflows": sorted(merged.values(), key=lambda w: w.name)})
        _check_unique_tools(pinned, spec)
        return pinned

    def _check_names(self, spec: ToolsetCreateRequest) -> None:
        seen: set[str] = set()
        for i, server in enumerate(spec.mcp):
            if server.name in seen:
                raise InvalidRequest(
                    f"Server name '{server.name}' is given twice.", details={"field": f"mcp[{i}].name"}
                )
            seen.add(server.name)
            problem = url_problem(server.url)
            if problem is not None:  # the URL is not quoted: it may be huge or hold control characters
                raise InvalidRequest(
                    f"Field 'mcp[{i}].url' (server '{server.name}') is not an MCP server's address: {problem}.",
                    details={"field": f"mcp[{i}].url", "server": server.name},
                )
            refused = self._egress.static_refusal(urlsplit(server.url).hostname or "")
            if refused is not None:
                raise egress_refused(
                    f"mcp[{i}].url", f"(server '{server.name}') ", refused, server=server.name
                )
        if spec.http is not None:
            for i, entry in enumerate(spec.http.allow):
                refused = self._egress.static_refusal(split_allow_entry(entry.strip())[0])
                if refused is not None:
                    raise egress_refused(f"http.allow[{i}]", "", refused)
        for i, tool in enumerate(spec.host):
            check_json_schema(tool.input_schema, f"host[{i}].inputSchema")
            if tool.output_schema is not None:
                check_json_schema(tool.output_schema, f"host[{i}].outputSchema")
            _check_rule(tool.policy, f"host[{i}].policy")
        for i, server in enumerate(spec.mcp):
            for name, policy in server.policies.items():
                _check_rule(policy, f"mcp[{i}].policies.{bounded(name, 200)}")
        if spec.http is not None:
            _check_rule(spec.http.policy, "http.policy")
        _check_credential_servers(spec, seen)

    async def _pin_servers(
        self, spec: ToolsetCreateRequest, on_pinned: Callable[[PinnedServer], None] | None
    ) -> list[ServerPin]:
        creds = spec.credentials.servers if spec.credentials else {}

        async def one(i: int) -> ServerPin:
            server = spec.mcp[i]
            headers = creds[server.name].plain_headers() if server.name in creds else {}
            try:
                listing = await self._list(server.name, server.url, headers)
            except HostNotAllowed as exc:  # a name resolving where the egress policy refuses
                raise egress_refused(
                    f"mcp[{i}].url", f"(server '{server.name}') ", exc.message, server=server.name
                ) from None
            listed, about = listing.tools, listing.about
            # Pinning is a pure function of the server's spec and what it listed: a server that
            # lists the same tools again (re-registration, the common case) is not pinned again.
            policies = {k: v.wire() for k, v in server.policies.items()}
            said = [about, server.description]
            try:
                key = orjson.dumps([server.name, server.url, policies, said, listed])
            except TypeError:  # an integer beyond 64 bits: pin it as the double the id takes it for
                listed = json_safe(listed)
                key = orjson.dumps([server.name, server.url, policies, said, listed])
            key = hashlib.blake2b(key, digest_size=32).digest()
            hit = self._memo.get(key)
            if hit is None:
                hit = _pin_server(i, server, listed, about, self._tool_limit)
                self._memo.put(key, hit)
                if on_pinned is not None:
                    on_pinned(hit.model)
            return hit

        pinned = await asyncio.gather(*(one(i) for i in range(len(spec.mcp))))
        return sorted(pinned, key=lambda s: s.model.name)

    async def _pin_workflows(self, refs: list[str]) -> list[PinnedWorkflow]:
        by_name: dict[str, PinnedWorkflow] = {}
        for i, ref in enumerate(refs):
            match = WORKFLOW_REF.fullmatch(ref)
            assert match is not None  # the model checked the form
            name, version = match.group(1), match.group(2)
            found = await self._workflow(name, version)
            if found is None:
                what = f"version {version} of workflow '{name}'" if version else f"workflow '{name}'"
                raise NotFound(f"No published {what}.", details={"field": f"workflows[{i}]"})
            if name in by_name:
                raise InvalidRequest(
                    f"Workflow '{name}' is given twice.", details={"field": f"workflows[{i}]"}
                )
            by_name[name] = PinnedWorkflow(
                name=found.name,
                version=found.version,
                description=found.description,
                input_schema=_writable(found.input_schema),
                output_schema=_writable(found.output_schema),
            )
        return sorted(by_name.values(), key=lambda w: w.name)


def _check_credential_servers(spec: ToolsetCreateRequest, servers: set[str]) -> None:
    """Refuse credentials for a server the toolset does not have, before anything is stored."""
    if spec.credentials is not None:
        for name in spec.credentials.servers:
            if name not in servers:
                raise InvalidRequest(
                    f"Credentials name server '{name}', which this toolset does not have.",
                    details={"field": f"credentials.servers.{name}", "server": name},
                )


def _check_unique_tools(pinned: PinnedToolset, spec: ToolsetCreateRequest) -> None:
    seen: set[str] = set()
    for name in qualified_names(pinned):
        if name in seen:
            raise InvalidRequest(
                f"Two tools have the qualified name '{name}'.",
                details={"field": _field_of_tool(spec, name), "tool": name},
            )
        seen.add(name)


def _field_of_tool(spec: ToolsetCreateRequest, name: str) -> str:
    """The spec's field that gave a tool of this qualified name: the last host tool of that name
    (a clash always has one: server names are unique, a server lists each name once, `http` and
    `workflows` are reserved host namespaces), else the server whose tool it is."""
    for i in range(len(spec.host) - 1, -1, -1):
        if spec.host[i].name == name:
            return f"host[{i}].name"
    server = name.partition(".")[0]
    for i, given in enumerate(spec.mcp):
        if given.name == server:
            return f"mcp[{i}].url"
    return "base" if spec.base is not None else "workflows"
