"""A large development corpus for tool search: Twilio's public REST API as MCP tools.

Twilio publishes its OpenAPI descriptions (`twilio-oai`) inside the npm package of its own MCP
server, `@twilio-alpha/mcp`; `load_twilio_tools()` fetches that package with `npm pack` (once,
into `.cache/apis/`), reads the spec files and converts every operation into an MCP tool the way
`@twilio-alpha/openapi-mcp-server` does (`build/utils/loadTools.js`): the operationId is the
tool's name, the description is `"<title>: <info description>. <operation description>"`, path,
query and form parameters are the properties of `inputSchema`. Each spec file is one MCP server
(its file name is the namespace: `twilio_api_v2010.CreateMessage`).

Deprecated duplicates are left out, as a deployment would leave them out: `ip_messaging` v1/v2
(the same operations as `chat`), `chat` v1 (superseded by v2), `preview`, and two files with no
operations: 1,239 tools over 44 servers. `load_large_corpus()` adds the 112 tools of the npm MCP
servers of the small corpus (as the issue's 1,189-tool toolset mixed an API with npm servers).

    python -m tests.registry.search.openapi_corpus     # fetch and summarise
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toolbus_contracts import EffectivePolicy, ToolInfo

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
CACHE = ROOT / ".cache" / "apis"
PACKAGE = "@twilio-alpha/mcp@0.7.0"
SPEC_DIR = "package/twilio-oai/spec/json/"
LEFT_OUT = frozenset(
    {
        "twilio_ip_messaging_v1",
        "twilio_ip_messaging_v2",
        "twilio_chat_v1",
        "twilio_preview",
        "twilio_iam_v2",
        "twilio_verify_v3",
    }
)
METHODS = ("get", "delete", "post", "put")  # what openapi-mcp-server serves
NPM_TIMEOUT_S = 180.0


def _specs_file() -> Path:
    return CACHE / "twilio-oai.json"


def fetch_specs() -> dict[str, dict[str, Any]]:
    """{spec name: OpenAPI document} from the npm package, cached as one JSON file. Raises
    `LookupError` when the package cannot be had (no npm, registry unreachable)."""
    cached = _specs_file()
    if cached.exists():
        specs: dict[str, dict[str, Any]] = json.loads(cached.read_text())
        return specs
    npm = shutil.which("npm")
    if npm is None:
        raise LookupError("npm is not on PATH")
    CACHE.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            [npm, "pack", PACKAGE, "--pack-destination", str(CACHE), "--json", "--loglevel=error"],
            capture_output=True,
            text=True,
            timeout=NPM_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LookupError(f"npm pack {PACKAGE} failed: {exc}") from exc
    if done.returncode != 0:
        raise LookupError(f"npm pack {PACKAGE} exited {done.returncode}: {done.stderr.strip()[-200:]}")
    tarball = CACHE / json.loads(done.stdout)[0]["filename"].replace("@", "").replace("/", "-")
    specs = {}
    with tarfile.open(tarball) as tar:
        for member in tar.getmembers():
            if member.name.startswith(SPEC_DIR) and member.name.endswith(".json"):
                handle = tar.extractfile(member)
                if handle is not None:
                    specs[Path(member.name).stem] = json.load(io.TextIOWrapper(handle, "utf-8"))
    tarball.unlink(missing_ok=True)
    if not specs:
        raise LookupError(f"{PACKAGE} holds no spec files under {SPEC_DIR}")
    tmp = cached.with_suffix(".tmp")
    tmp.write_text(json.dumps(specs, sort_keys=True))
    tmp.replace(cached)
    return specs


def _to_schema(schema: Mapping[str, Any], description: str | None = None) -> dict[str, Any]:
    """openapi-mcp-server's `toSchema`: type (string by default), description, items, properties."""
    out: dict[str, Any] = {
        "type": schema.get("type", "string"),
        "description": description if description is not None else schema.get("description", ""),
    }
    if schema.get("type") == "array" and isinstance(schema.get("items"), Mapping):
        out["items"] = _to_schema(schema["items"])
    if schema.get("type") == "object" and isinstance(schema.get("properties"), Mapping):
        out["properties"] = {k: _to_schema(v) for k, v in schema["properties"].items()}
        if schema.get("required"):
            out["required"] = list(schema["required"])
    return out


def spec_tools(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The MCP tools (`name`, `description`, `inputSchema`) of one OpenAPI document."""
    info = spec.get("info", {})
    title = info.get("title", "")
    about = (info.get("description") or "").rstrip(".")
    tools: dict[str, dict[str, Any]] = {}
    for path, item in (spec.get("paths") or {}).items():
        for method, op in item.items():
            if method not in METHODS or not isinstance(op, Mapping):
                continue
            text = op.get("description") or f"Make a {method.upper()} request to {path}"
            props: dict[str, Any] = {}
            required: list[str] = []
            for param in op.get("parameters") or []:
                if "name" in param and "in" in param:
                    props[param["name"]] = _to_schema(
                        param.get("schema") or {}, param.get("description") or f"{param['name']} parameter"
                    )
                    if param.get("required"):
                        required.append(param["name"])
            content = (op.get("requestBody") or {}).get("content") or {}
            body = content.get("application/x-www-form-urlencoded") or content.get("application/json") or {}
            schema = body.get("schema") or {}
            required.extend(schema.get("required") or [])
            for key, prop in (schema.get("properties") or {}).items():
                props[key] = _to_schema(prop, prop.get("description") or f"{key} parameter")
            tools[op["operationId"]] = {
                "name": op["operationId"],
                "description": f"{title}: {about}. {text}",
                "inputSchema": {"type": "object", "properties": props, "required": required},
            }
    return list(tools.values())


def _info(server: str, tool: Mapping[str, Any]) -> ToolInfo:
    return ToolInfo(
        name=f"{server}.{tool['name']}",
        kind="mcp",
        description=tool["description"],
        input_schema=tool["inputSchema"],
        policy=EffectivePolicy.for_kind("mcp", None),
    )


def twilio_servers() -> dict[str, list[dict[str, Any]]]:
    """{server (spec file) name: its MCP tools as listed}, deprecated duplicates left out."""
    specs = fetch_specs()
    out = {name: spec_tools(specs[name]) for name in sorted(specs) if name not in LEFT_OUT}
    return {name: tools for name, tools in out.items() if tools}


def load_twilio_tools() -> list[ToolInfo]:
    return [_info(server, t) for server, tools in twilio_servers().items() for t in tools]


def load_large_corpus() -> list[ToolInfo]:
    """Twilio's 1,239 tools and the 112 npm MCP tools: 1,351 tools. Raises `LookupError` when the
    npm package or a catalogue cannot be had."""
    from tests.registry.search.labelled import load_tools

    return load_twilio_tools() + load_tools()


if __name__ == "__main__":
    servers = twilio_servers()
    print(f"{sum(len(t) for t in servers.values())} tools over {len(servers)} servers")
