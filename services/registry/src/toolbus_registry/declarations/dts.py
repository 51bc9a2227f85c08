"""The `dts` declarations of a toolset: one TypeScript module a script imports its tools from.

Layout of the module (the same toolset always gives the same bytes):

- `JsonValue` and the MCP content block types, shared by every tool;
- per namespace (MCP server, host group, `http`, `workflows`) a value `export const <ns>: {...}`
  whose members are its tools under their own names, quoted where a name is not an identifier;
- a host tool with no group is `export function <name>(...)` (or, when a namespace has the same
  name, the call signature of that namespace's value);
- types that `$ref`s need live in `export namespace $<ns>.<tool> {...}`; `$` cannot start a
  server or host name, so these never meet a tool's export.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from toolbus_contracts import ToolInfo

from toolbus_registry.declarations.names import Scope, member_key, split_tool_name, ts_string
from toolbus_registry.declarations.schema_to_ts import JSON_VALUE, Alias, TypeRenderer, jsdoc

MCP_RESULT_WITHOUT_SCHEMA = "{ content: ContentBlock[] }"

PRELUDE = """\
/** Any JSON value: the type of whatever a schema leaves open. */
export type JsonValue = string | number | boolean | null | JsonValue[] | { [key: string]: JsonValue | undefined };
/** Extra data an MCP server attaches to a content block. */
export type Meta = { [key: string]: JsonValue };
/** Hints on how a client should use a content block. */
export type Annotations = {
  audience?: ("user" | "assistant")[];
  priority?: number;
  lastModified?: string;
  [key: string]: JsonValue | undefined;
};
export type TextContent = { type: "text"; text: string; annotations?: Annotations; _meta?: Meta };
/** `data` is base64. */
export type ImageContent = {
  type: "image";
  data: string;
  mimeType: string;
  annotations?: Annotations;
  _meta?: Meta;
};
/** `data` is base64. */
export type AudioContent = {
  type: "audio";
  data: string;
  mimeType: string;
  annotations?: Annotations;
  _meta?: Meta;
};
export type ResourceLink = {
  type: "resource_link";
  uri: string;
  name: string;
  title?: string;
  description?: string;
  mimeType?: string;
  size?: number;
  annotations?: Annotations;
  _meta?: Meta;
  [key: string]: JsonValue | undefined;
};
export type TextResourceContents = { uri: string; mimeType?: string; text: string; _meta?: Meta };
/** `blob` is base64. */
export type BlobResourceContents = { uri: string; mimeType?: string; blob: string; _meta?: Meta };
export type EmbeddedResource = {
  type: "resource";
  resource: TextResourceContents | BlobResourceContents;
  annotations?: Annotations;
  _meta?: Meta;
};
/** One block of an MCP tool result: what a tool without an outputSchema returns a list of. */
export type ContentBlock = TextContent | ImageContent | AudioContent | ResourceLink | EmbeddedResource;
"""


@dataclass(frozen=True)
class ToolDecl:
    """One tool rendered: its member (or function) text and the named types it needs."""

    namespace: str | None
    member: str
    signature: str  # `(input: ...): Promise<...>`, starting at the open parenthesis
    doc: str  # the JSDoc, ending in a newline and the member's indent
    sub: str | None  # the name of the tool's own type namespace, where it has named types
    aliases: tuple[Alias, ...]


def render_tool(tool: ToolInfo, scope: Scope, indent: str, alias_indent: str) -> ToolDecl:
    """Render one tool's signature, claiming the name of its type namespace from `scope` only if
    its schemas need named types."""
    namespace, member = split_tool_name(tool)
    type_ns = "$" + (namespace if namespace is not None else member)
    claimed: list[str] = []

    def qualify(name: str) -> str:
        if not claimed:
            claimed.append(scope.claim(member))
        return f"{type_ns}.{claimed[0]}.{name}"

    renderer = TypeRenderer(qualify, alias_indent)
    input_type = renderer.render_document(tool.input_schema, indent)
    if tool.output_schema is not None:
        output_type = renderer.render_document(tool.output_schema, indent)
    elif tool.kind == "mcp":
        output_type = MCP_RESULT_WITHOUT_SCHEMA
    else:
        output_type = JSON_VALUE
    description = (tool.description or "").strip()
    return ToolDecl(
        namespace=namespace,
        member=member,
        signature=f"(input: {input_type}): Promise<{output_type}>",
        doc=jsdoc(description.splitlines(), indent),
        sub=claimed[0] if claimed else None,
        aliases=tuple(renderer.aliases),
    )


def _alias_block(type_ns: str, decls: Sequence[ToolDecl], indent: str, declare: bool) -> str:
    """`namespace $ns { namespace tool { export type A = ...; } }` for the tools that need it."""
    with_types = [d for d in decls if d.sub is not None and d.aliases]
    if not with_types:
        return ""
    out: list[str] = []
    head = "declare namespace" if declare else "export namespace"
    out.append(f"{indent}{head} {type_ns} {{\n")
    for decl in with_types:
        out.append(f"{indent}  export namespace {decl.sub} {{\n")
        inner = indent + "    "
        for alias in decl.aliases:
            out.append(f"{inner}{jsdoc(alias.doc, inner)}export type {alias.name} = {alias.body};\n")
        out.append(f"{indent}  }}\n")
    out.append(f"{indent}}}\n")
    return "".join(out)


def _namespace_value(
    name: str, members: Sequence[ToolDecl], call: ToolDecl | None, indent: str, head: str
) -> str:
    inner = indent + "  "
    out = [f"{indent}{head} {name}: {{\n"]
    if call is not None:
        out.append(f"{inner}{call.doc}{call.signature};\n")
    for decl in members:
        out.append(f"{inner}{decl.doc}{member_key(decl.member)}{decl.signature};\n")
    out.append(f"{indent}}};\n")
    return "".join(out)


def _sorted(tools: Sequence[ToolInfo]) -> list[ToolInfo]:
    return sorted(tools, key=lambda t: t.name)


def render_dts(tools: Sequence[ToolInfo], module_name: str) -> str:
    """The whole `declare module "<module_name>"` text for a toolset's tools."""
    namespaces: dict[str, list[ToolInfo]] = {}
    top_level: list[ToolInfo] = []
    for tool in _sorted(tools):
        namespace, _ = split_tool_name(tool)
        if namespace is None:
            top_level.append(tool)
        else:
            namespaces.setdefault(namespace, []).append(tool)

    indent = "  "
    scopes: dict[str, Scope] = {}
    rendered: dict[str, list[ToolDecl]] = {}
    calls: dict[str, ToolDecl] = {}
    for tool in top_level:
        scope = scopes.setdefault(tool.name, Scope())
        decl = render_tool(tool, scope, indent + "  " if tool.name in namespaces else indent, "      ")
        calls[tool.name] = decl
    for name in sorted(namespaces):
        scope = scopes.setdefault(name, Scope())
        rendered[name] = [render_tool(t, scope, indent + "  ", "      ") for t in namespaces[name]]

    out: list[str] = [
        "// Generated by toolbus from the toolset's schemas; the same toolset gives the same text.\n",
        f"declare module {ts_string(module_name)} {{\n",
    ]
    out.extend(f"{indent}{line}\n" if line else "\n" for line in PRELUDE.rstrip("\n").split("\n"))
    for name in sorted(set(namespaces) | set(calls)):
        decls = rendered.get(name, [])
        call = calls.get(name)
        out.append("\n")
        out.append(_alias_block("$" + name, [*([call] if call else []), *decls], indent, False))
        if name in namespaces:
            out.append(_namespace_value(name, decls, call, indent, "export const"))
        elif call is not None:
            out.append(f"{indent}{call.doc}export function {name}{call.signature};\n")
    out.append("}\n")
    return "".join(out)


def tool_dts_fragment(tool: ToolInfo) -> str:
    """One tool's declaration on its own, as a search result shows it: its named types, then the
    value a script calls it through (`declare const <ns>: {...}` or `declare function <name>`).
    The types it uses (`JsonValue`, `ContentBlock`) are those of the toolset's module."""
    namespace, member = split_tool_name(tool)
    if namespace is None:
        decl = render_tool(tool, Scope(), "", "    ")
        return (
            _alias_block("$" + member, [decl], "", True)
            + f"{decl.doc}declare function {member}{decl.signature};\n"
        )
    decl = render_tool(tool, Scope(), "  ", "    ")
    return _alias_block("$" + namespace, [decl], "", True) + _namespace_value(
        namespace, [decl], None, "", "declare const"
    )
