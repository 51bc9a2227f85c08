"""The type-check gate: generated declarations against `tsc --noEmit --strict`.

One tsc run checks a toolset's whole `.d.ts` and one script holding a call per valid input
(which must compile) and a call per invalid input under `// @ts-expect-error` (an invalid call that
compiles shows up as an unused directive). `run_gate` says, per tool, what went wrong.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolbus_contracts import EffectivePolicy, ToolInfo
from toolbus_registry.declarations import render_dts
from toolbus_registry.declarations.names import member_access, split_tool_name

from tests.tsc.values import cases

ROOT = Path(__file__).resolve().parents[2]
MODULE = "rewind:tools"
_DIAG = re.compile(r"^(?P<file>[^()\n]+)\((?P<line>\d+),(?P<col>\d+)\): error (?P<code>TS\d+): (?P<msg>.*)$")


def find_tsc() -> str | None:
    """The tsc to use: `TOOLBUS_TSC`, then `.cache/npm`, then PATH; None when there is none."""
    env = os.environ.get("TOOLBUS_TSC")
    if env and Path(env).exists():
        return env
    local = ROOT / ".cache" / "npm" / "node_modules" / ".bin" / "tsc"
    if local.exists():
        return str(local)
    return shutil.which("tsc")


def tools_from_catalogue(server: str, listed: Sequence[dict[str, Any]]) -> list[ToolInfo]:
    """ToolInfo of a server's listed tools, named `<server>.<tool>` as the registry names them."""
    return [
        ToolInfo(
            name=f"{server}.{t['name']}",
            kind="mcp",
            description=t.get("description") or "",
            input_schema=t.get("inputSchema") or {"type": "object"},
            output_schema=t.get("outputSchema"),
            policy=EffectivePolicy(),
        )
        for t in listed
    ]


@dataclass
class GateResult:
    """What one gate run found."""

    tools: int = 0
    valid_calls: int = 0
    invalid_calls: int = 0
    declaration_errors: list[str] = field(default_factory=list)
    valid_rejected: list[str] = field(default_factory=list)  # "tool: input -> tsc message"
    invalid_accepted: list[str] = field(default_factory=list)  # "tool: label"
    other_errors: list[str] = field(default_factory=list)
    dts_bytes: int = 0


def _call_expr(tool: ToolInfo) -> str:
    namespace, member = split_tool_name(tool)
    if namespace is None:
        return f"T.{member}"
    return member_access(f"T.{namespace}", member)


def run_gate(tools: Sequence[ToolInfo], tsc: str) -> GateResult:
    """Render, write and type-check; map every tsc diagnostic back to its tool and call."""
    result = GateResult(tools=len(tools))
    dts = render_dts(tools, MODULE)
    result.dts_bytes = len(dts.encode())
    lines = [f'import * as T from "{MODULE}";', "export async function main(): Promise<void> {"]
    where: dict[int, tuple[str, bool, str, str]] = {}  # line -> (tool, valid, label, input)
    for tool in sorted(tools, key=lambda t: t.name):
        expr = _call_expr(tool)
        for case in cases(tool.input_schema):
            literal = json.dumps(case.input, ensure_ascii=False)
            if case.valid:
                result.valid_calls += 1
            else:
                result.invalid_calls += 1
                lines.append("  // @ts-expect-error")
                where[len(lines)] = (tool.name, False, case.label, literal)
            lines.append(f"  await {expr}({literal});")
            if case.valid:
                where[len(lines)] = (tool.name, True, case.label, literal)
    lines.append("}")
    with tempfile.TemporaryDirectory(prefix="toolbus-tsc-") as tmp:
        Path(tmp, "tools.d.ts").write_text(dts)
        Path(tmp, "calls.ts").write_text("\n".join(lines) + "\n")
        done = subprocess.run(
            [
                tsc,
                "--noEmit",
                "--strict",
                "--target",
                "es2022",
                "--module",
                "esnext",
                "--moduleResolution",
                "bundler",
                "--types",
                "",
                "--pretty",
                "false",
                "tools.d.ts",
                "calls.ts",
            ],
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    for raw in (done.stdout + done.stderr).splitlines():
        match = _DIAG.match(raw.strip())
        if match is None:
            continue
        file, line, code, msg = match["file"], int(match["line"]), match["code"], match["msg"]
        if file.endswith("tools.d.ts"):
            result.declaration_errors.append(f"{line}: {code} {msg}")
            continue
        hit = where.get(line)
        if hit is not None and hit[1] and code != "TS2578":
            result.valid_rejected.append(f"{hit[0]}: {hit[3][:200]} -> {code} {msg[:300]}")
        elif hit is not None and not hit[1] and code == "TS2578":
            result.invalid_accepted.append(f"{hit[0]}: {hit[2]}")
        elif not (hit is None and code != "TS2578" and where.get(line - 1, ("", True))[1] is False):
            result.other_errors.append(raw.strip()[:300])
    return result
