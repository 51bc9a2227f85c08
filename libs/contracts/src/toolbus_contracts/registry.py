"""Registry bodies: toolset specs, pinned toolsets, effective policies, declarations, workflows."""

from __future__ import annotations

import functools
import re
from typing import Annotated, Any, Literal

import orjson
from pydantic import AfterValidator, Field, SerializerFunctionWrapHandler, model_serializer

from toolbus_contracts.base import Duration, WireModel, bounded, null_as
from toolbus_contracts.credentials import Credentials
from toolbus_contracts.names import NAME_MAX, ToolsetId, WorkflowVersion, is_allow_entry

IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_NAMES = frozenset({"http", "workflows"})
WORKFLOW_REF = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:@([0-9a-f]{12}))?$")

ToolKind = Literal["mcp", "host", "http", "workflow"]
OnInterruption = Literal["retry", "at_most_once"]

DEFAULT_TIMEOUT = "5m"
DEFAULT_HEARTBEAT_TIMEOUT = "60s"
RUN_CONCURRENCY = 16
MAX_ATTEMPTS = 5


def _check_ident(name: str) -> str:
    if len(name) > NAME_MAX:
        raise ValueError(f"a name is at most {NAME_MAX} characters")
    if not IDENT.fullmatch(name):
        raise ValueError(f"'{bounded(name)}' must match [A-Za-z_][A-Za-z0-9_]*")
    if name in RESERVED_NAMES:
        raise ValueError(f"'{bounded(name)}' is reserved")
    return name


def _check_host_name(name: str) -> str:
    parts = name.split(".")
    if len(parts) > 2:
        raise ValueError(f"'{bounded(name)}' has more than one dot")
    for part in parts:
        if len(part) > NAME_MAX:
            raise ValueError(f"each part of a name is at most {NAME_MAX} characters")
        if not IDENT.fullmatch(part):
            raise ValueError(f"'{bounded(name)}': each part must match [A-Za-z_][A-Za-z0-9_]*")
    if parts[0] in RESERVED_NAMES:
        raise ValueError(f"'{bounded(name)}' uses the reserved name '{parts[0]}'")
    return name


def _check_workflow_ref(value: str) -> str:
    if len(value.split("@")[0]) > NAME_MAX or not WORKFLOW_REF.fullmatch(value):
        raise ValueError(f"'{bounded(value)}' is not a workflow name, or name@version with 12 hex digits")
    return value


def _check_allow_entry(entry: str) -> str:
    if not is_allow_entry(entry):
        raise ValueError(
            f"'{bounded(entry)}' is not an allow entry: a host name, '*.' and a host name, or an IP "
            "literal, each optionally with ':' and a port (1-65535)"
        )
    return entry


ServerName = Annotated[str, AfterValidator(_check_ident)]
HostToolName = Annotated[str, AfterValidator(_check_host_name)]
WorkflowRef = Annotated[str, AfterValidator(_check_workflow_ref)]
WorkflowName = Annotated[str, AfterValidator(_check_ident)]
AllowEntry = Annotated[str, AfterValidator(_check_allow_entry)]


class ApprovalRule(WireModel):
    """`approval: {"when": <JSON Schema>}`: a call waits for a decision only when the schema
    accepts `{"input": <the call's input>, "tool": <name>, "run": {"runId", "namespace",
    "toolsetId", "credentials"}}` (`credentials`: the level an MCP call's headers come from,
    `toolset`/`namespace`/`run`; null for other kinds). A rule that cannot be evaluated (a `$ref`
    that does not resolve, a value nested too deep) asks for approval."""

    when: dict[str, Any]

    def __hash__(self) -> int:  # frozen policies are cached by value: hash the schema's JSON
        return hash(orjson.dumps(self.when, option=orjson.OPT_SORT_KEYS))


class PolicySpec(WireModel):
    """A tool's policy as given: every field optional, defaults filled in by the registry."""

    on_interruption: OnInterruption | None = None
    approval: bool | ApprovalRule | None = None
    approval_timeout: Duration | None = None
    timeout: Duration | None = None
    heartbeat_timeout: Duration | None = None
    concurrency: int | None = Field(default=None, ge=1, le=RUN_CONCURRENCY)


class EffectivePolicy(WireModel):
    """The policy a call runs under, every default filled in. `concurrency` null: no per-tool limit;
    `timeout` null: no per-attempt limit (host tools, bounded by heartbeats, and workflows)."""

    on_interruption: OnInterruption = "retry"
    approval: bool | ApprovalRule = False
    approval_timeout: Duration | None = None
    """How long a call of this tool waits for a decision before it is denied `expired`; null:
    the approval service's `TOOLBUS_APPROVAL_TIMEOUT`."""
    timeout: Duration | None = None
    heartbeat_timeout: Duration = DEFAULT_HEARTBEAT_TIMEOUT
    concurrency: int | None = Field(default=None, ge=1, le=RUN_CONCURRENCY)

    @model_serializer(mode="wrap")
    def _keep_nulls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        out.setdefault("timeout", None)
        out.setdefault("concurrency", None)
        return out

    @staticmethod
    def for_kind(kind: ToolKind, spec: PolicySpec | None) -> EffectivePolicy:
        """Defaults of the contract for this kind of tool, overridden by what the spec gives.
        Cached: a 1,000-tool toolset has a handful of distinct policies, and both are frozen."""
        return _effective_policy(kind, spec)


@functools.lru_cache(maxsize=4096)
def _effective_policy(kind: ToolKind, spec: PolicySpec | None) -> EffectivePolicy:
    given = spec.model_dump(exclude_none=True) if spec else {}
    if kind in ("mcp", "http"):
        given.setdefault("timeout", DEFAULT_TIMEOUT)
    return EffectivePolicy.model_validate(given)


SUMMARY_MAX = 300
"""Longest `description` a user gives an MCP server (one line of the namespace catalogue)."""
ABOUT_MAX = 2000
"""Characters of an MCP server's own account of itself (`instructions`, else its title or
description) pinned with its tools."""


class McpServerSpec(WireModel):
    name: ServerName
    url: str
    policies: Annotated[dict[str, PolicySpec], null_as(dict)] = Field(default_factory=dict)
    description: str | None = Field(default=None, min_length=1, max_length=SUMMARY_MAX)
    """What the server is for, in a line: the namespace's summary in `toolsets.namespaces` when the
    server says nothing of itself. Pinned (part of the toolset id: a model reads it)."""


class HostToolSpec(WireModel):
    name: HostToolName
    description: Annotated[str, null_as("")] = ""
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None
    policy: PolicySpec | None = None


class HttpSpec(WireModel):
    allow: list[AllowEntry] = Field(max_length=1000)
    policy: PolicySpec | None = None


class ToolsetCreateRequest(WireModel):
    """A toolset spec, or a derivation from `base`."""

    mcp: Annotated[list[McpServerSpec], null_as(list)] = Field(default_factory=list)
    host: Annotated[list[HostToolSpec], null_as(list)] = Field(default_factory=list)
    http: HttpSpec | None = None
    workflows: Annotated[list[WorkflowRef], null_as(list)] = Field(default_factory=list)
    credentials: Credentials | None = None
    base: ToolsetId | None = None


# ---- Pinned toolset: what the id is computed over and what the dispatcher runs against ---------


class PinnedTool(WireModel):
    """An MCP tool exactly as its server listed it at registration."""

    name: str
    title: str | None = None
    description: str | None = None
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None
    annotations: dict[str, Any] | None = None


class PinnedServer(WireModel):
    name: str
    url: str
    tools: list[PinnedTool]
    policies: dict[str, PolicySpec] = Field(default_factory=dict)
    about: str | None = None
    """The server's own account of itself when it was listed: its `instructions`, else its
    `serverInfo` title or description (at most `ABOUT_MAX` characters)."""
    description: str | None = None
    """The user's one-line description of the server (`McpServerSpec.description`)."""


class PinnedWorkflow(WireModel):
    name: str
    version: str
    description: str = ""
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None


class PinnedToolset(WireModel):
    """The content a toolset id addresses. Normalised: servers, host tools, allow entries and
    workflows sorted by name, so their order in the spec does not change the id."""

    servers: list[PinnedServer] = Field(default_factory=list)
    host: list[HostToolSpec] = Field(default_factory=list)
    http: HttpSpec | None = None
    workflows: list[PinnedWorkflow] = Field(default_factory=list)


class ToolInfo(WireModel):
    """One tool of a toolset as replies show it: qualified name, kind, schemas, effective policy."""

    name: str
    kind: ToolKind
    description: str = ""
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None
    policy: EffectivePolicy


class Declarations(WireModel):
    prompt: str
    dts: str


class ToolsetCreateReply(WireModel):
    id: str
    tools: list[ToolInfo] | None = None
    declarations: Declarations | None = None
    tool_count: int | None = None
    truncated: bool | None = None


class ToolsetGetRequest(WireModel):
    id: ToolsetId
    cursor: str | None = None


class VectorState(WireModel):
    """How many of a toolset's tools are embedded (search is at full quality when all are)."""

    ready: int
    tools: int


class ToolsetGetReply(WireModel):
    id: str
    tools: list[ToolInfo]
    next_cursor: str | None = None
    vectors: VectorState | None = None
    """Absent when this replica holds no search index of the toolset (none searched or
    registered here since it started, or dropped from its cache)."""


DeclarationFormat = Literal["prompt", "dts"]


class ToolsetDeclarationsRequest(WireModel):
    id: ToolsetId
    format: DeclarationFormat
    cursor: str | None = None
    namespace: str | None = Field(default=None, min_length=1, max_length=NAME_MAX)
    """Only this namespace's tools (`toolsets.namespaces` names them): a model browsing one."""


class ToolsetDeclarationsReply(WireModel):
    format: DeclarationFormat
    text: str
    next_cursor: str | None = None


NAMESPACES_MAX = 100
"""Namespaces one search may be scoped to."""


class ToolsetSearchRequest(WireModel):
    id: ToolsetId
    query: str = Field(min_length=1)
    limit: Annotated[int, null_as(5)] = Field(default=5, ge=1, le=50)
    namespaces: list[Annotated[str, Field(min_length=1, max_length=NAME_MAX)]] | None = Field(
        default=None, min_length=1, max_length=NAMESPACES_MAX
    )
    """Search only the tools of these namespaces (`toolsets.namespaces`); absent: every tool."""


class SearchHit(WireModel):
    name: str
    namespace: str
    """The namespace the tool belongs to (what a search's `namespaces` scopes by)."""
    prompt: str
    dts: str
    score: float


SearchRanking = Literal["lexical", "partial", "hybrid"]
"""How a search was answered: `hybrid` (BM25F and the embedding model over every tool, fused and
re-ranked), `partial` (the same while the toolset is still being embedded: the query's lexical
head was embedded first, tools without vectors yet rank lexically only) or `lexical` (BM25F
alone: no vector could be had)."""


class ToolsetSearchReply(WireModel):
    tools: list[SearchHit]
    ranking: SearchRanking | None = None


NamespaceKind = Literal["mcp", "host", "http", "workflows"]
SummarySource = Literal["server", "user", "derived"]


class NamespaceInfo(WireModel):
    """One namespace of a toolset in the catalogue a model picks from."""

    name: str
    kind: NamespaceKind
    tool_count: int
    summary: str
    """One line: the MCP server's own (`server`), the user's `description` (`user`), else made
    from the namespace's tools (`derived`)."""
    summary_source: SummarySource


class ToolsetNamespacesRequest(WireModel):
    id: ToolsetId
    cursor: str | None = None


class ToolsetNamespacesReply(WireModel):
    id: str
    namespaces: list[NamespaceInfo]
    next_cursor: str | None = None


class WorkflowPublishRequest(WireModel):
    name: WorkflowName
    description: Annotated[str, null_as("")] = ""
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None
    definition: Any = None


class WorkflowPublishReply(WireModel):
    name: str
    version: str


class WorkflowGetRequest(WireModel):
    name: WorkflowName
    version: WorkflowVersion | None = None


class Workflow(WireModel):
    """A published workflow version (the `workflows.get` reply)."""

    name: str
    version: str
    description: str = ""
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None
    definition: Any = None
    published_at: str | None = None


HTTP_FETCH_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "url": {"type": "string", "description": "http or https URL on the toolset's allow-list."},
        "method": {
            "type": "string",
            "enum": ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"],
            "default": "GET",
        },
        "headers": {"type": "object", "additionalProperties": {"type": "string"}},
        "body": {"type": "string", "description": "Request body as text."},
    },
    "required": ["url"],
    "additionalProperties": False,
}
"""Input of the built-in `http.fetch` tool."""

HTTP_FETCH_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "status": {"type": "integer"},
        "headers": {"type": "object", "additionalProperties": {"type": "string"}},
        "body": {"type": "string", "description": "Text, or base64 when bodyEncoding is base64."},
        "bodyEncoding": {"type": "string", "enum": ["text", "base64"]},
    },
    "required": ["status", "headers", "body", "bodyEncoding"],
    "additionalProperties": False,
}
"""Output of the built-in `http.fetch` tool."""

HTTP_FETCH_DESCRIPTION = (
    "Fetch a URL on the toolset's allow-list over http or https and return status, headers and body."
)
