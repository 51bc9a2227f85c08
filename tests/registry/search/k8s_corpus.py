"""A second large corpus for tool search: Kubernetes' API as MCP tools, from the PyPI package of
its official Python client (`kubernetes`, generated from the API's OpenAPI description).

Each API class of `kubernetes/client/api/` is one MCP server (its module name without `_api` is
the namespace: `apps_v1`), each of its public operations one tool (`apps_v1.create_namespaced_deployment`),
described by the operation's own description ("create a Deployment"), its parameters (name,
description and type, from the docstring) the properties of `inputSchema`; the `_with_http_info`
and `_without_preload_content` variants of each operation, and each class's `close` (the
client's, not an operation), are left out. 999 tools over 66 servers. The wheel is fetched with `pip download` (once, into `.cache/apis/`).

    python -m tests.registry.search.k8s_corpus     # fetch and summarise
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

from toolbus_contracts import EffectivePolicy, ToolInfo

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
CACHE = ROOT / ".cache" / "apis"
VERSION = "37.0.2"
WHEEL = f"kubernetes-{VERSION}-py2.py3-none-any.whl"
PIP_TIMEOUT_S = 300.0
_TYPES = {"str": "string", "bool": "boolean", "int": "integer", "float": "number"}
_PARAM = re.compile(r"^:param (\w+):\s*(.*)$")
_TYPE = re.compile(r"^:type (\w+):\s*(.*)$")


def _wheel() -> Path:
    """The client's wheel, fetched with pip once. Raises `LookupError` when it cannot be had."""
    path = CACHE / "k8s" / WHEEL
    if path.exists():
        return path
    pip = shutil.which("pip3") or shutil.which("pip")
    command = [pip] if pip else [sys.executable, "-m", "pip"]
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(
            [*command, "download", "--no-deps", f"kubernetes=={VERSION}", "-d", str(path.parent)],
            check=True,
            capture_output=True,
            timeout=PIP_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise LookupError(f"pip download kubernetes=={VERSION} failed: {exc}") from exc
    if not path.exists():
        raise LookupError(f"pip download did not give {WHEEL}")
    return path


def _tool(namespace: str, fn: ast.FunctionDef) -> ToolInfo:
    doc = ast.get_docstring(fn) or ""
    paragraphs = [p.strip() for p in doc.split("\n\n")]
    description = next((p for p in paragraphs[1:] if p and not p.startswith(":")), "")
    params: dict[str, dict[str, Any]] = {}
    required: list[str] = []
    for line in doc.splitlines():
        if m := _PARAM.match(line.strip()):
            name, text = m.group(1), m.group(2)
            if name == "async_req" or name.startswith("_"):
                continue
            if text.endswith("(required)"):
                required.append(name)
                text = text.removesuffix("(required)").strip()
            params[name] = {"type": "object", **({"description": text} if text else {})}
        elif (m := _TYPE.match(line.strip())) and m.group(1) in params:
            params[m.group(1)]["type"] = _TYPES.get(m.group(2), "object")
    schema: dict[str, Any] = {"type": "object", "properties": params}
    if required:
        schema["required"] = required
    return ToolInfo(
        name=f"{namespace}.{fn.name}",
        kind="mcp",
        description=description,
        input_schema=schema,
        policy=EffectivePolicy.for_kind("mcp", None),
    )


def load_k8s_tools() -> list[ToolInfo]:
    """Every operation of the Kubernetes API as a tool, sorted by name."""
    tools: list[ToolInfo] = []
    with zipfile.ZipFile(_wheel()) as wheel:
        for member in sorted(wheel.namelist()):
            m = re.fullmatch(r"kubernetes/client/api/([a-z0-9_]+)_api\.py", member)
            if m is None:
                continue
            tree = ast.parse(wheel.read(member).decode())
            for cls in (c for c in tree.body if isinstance(c, ast.ClassDef)):
                for fn in cls.body:
                    if (
                        isinstance(fn, ast.FunctionDef)
                        and not fn.name.startswith("_")
                        and fn.name != "close"  # the client's own, not an operation
                        and not fn.name.endswith(("_with_http_info", "_without_preload_content"))
                    ):
                        tools.append(_tool(m.group(1), fn))
    return sorted(tools, key=lambda t: t.name)


def load_k8s_corpus() -> list[ToolInfo]:
    """The Kubernetes operations plus the 111 tools of the small corpus's npm servers (as the
    Twilio corpus mixes an API with them): 1,110 tools. Raises `LookupError` as they do."""
    from tests.registry.search.labelled import load_tools

    return load_k8s_tools() + load_tools()


if __name__ == "__main__":
    found = load_k8s_tools()
    print(f"{len(found)} tools over {len({t.name.partition('.')[0] for t in found})} servers")
