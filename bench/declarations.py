"""Declarations bench: per real MCP catalogue, tsc errors, valid calls rejected, invalid calls
accepted, dts size against the schemas' JSON size; and generation time for 1,000 and 10,000 tools
synthesized from those catalogues.

    uv run python bench/declarations.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolbus_contracts import ToolInfo
from toolbus_registry.declarations import render_dts, render_prompt

from bench.harness import Figure, not_measured
from tests.catalogues.fetch import last_skipped, load_catalogues
from tests.tsc.edge_cases import edge_tools
from tests.tsc.gate import find_tsc, run_gate, tools_from_catalogue

SECTION = "declarations"


def _schema_bytes(tools: list[ToolInfo]) -> int:
    return sum(len(json.dumps(t.input_schema)) + len(json.dumps(t.output_schema or {})) for t in tools)


def _synthesize(base: list[ToolInfo], n: int) -> list[ToolInfo]:
    out = []
    for i in range(n):
        t = base[i % len(base)]
        out.append(t.model_copy(update={"name": f"s{i // len(base)}_{t.name}"}))
    return out


def _best(fn, repeat: int = 3) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    tsc = find_tsc()
    catalogues = load_catalogues()
    for name, reason in last_skipped.items():
        print(f"skipped {name}: {reason}")
    print(f"tsc: {tsc or 'not found (type-check columns empty)'}")
    print(
        f"{'catalogue':20} {'tools':>5} {'tscErr':>6} {'validRej':>8} {'invAcc':>6} {'valid':>5} {'invalid':>7}"
        f" {'schemaKB':>8} {'dtsKB':>6} {'ratio':>5} {'promptKB':>8} {'gen ms':>7}"
    )
    all_tools: list[ToolInfo] = []
    corpora = [(n, tools_from_catalogue(n, listed)) for n, listed in catalogues.items()]
    corpora.append(("edge-cases", edge_tools()))
    for name, tools in corpora:
        if name != "edge-cases":
            all_tools.extend(tools)
        gen = _best(lambda tools=tools: render_dts(tools, "rewind:tools"))
        dts = render_dts(tools, "rewind:tools")
        prompt = render_prompt(tools)
        schema = _schema_bytes(tools)
        row = f"{name:20} {len(tools):5}"
        if tsc:
            r = run_gate(tools, tsc)
            row += (
                f" {len(r.declaration_errors):6} {len(r.valid_rejected):8} {len(r.invalid_accepted):6}"
                f" {r.valid_calls:5} {r.invalid_calls:7}"
            )
        else:
            row += f" {'-':>6} {'-':>8} {'-':>6} {'-':>5} {'-':>7}"
        row += (
            f" {schema / 1024:8.1f} {len(dts) / 1024:6.1f} {len(dts) / max(schema, 1):5.2f}"
            f" {len(prompt) / 1024:8.1f} {gen * 1000:7.1f}"
        )
        print(row)
    if not all_tools:
        return
    prompt100 = render_prompt(all_tools[:100])
    print(
        f"\nprompt for {min(100, len(all_tools))} real tools: {len(prompt100)} chars "
        f"(~{len(prompt100) // 4} tokens at 4 chars/token)"
    )
    for n in (1_000, 10_000):
        tools = _synthesize(all_tools, n)
        dts_t = _best(lambda tools=tools: render_dts(tools, "rewind:tools"), 2 if n > 1000 else 3)
        prompt_t = _best(lambda tools=tools: render_prompt(tools), 2 if n > 1000 else 3)
        size = len(render_dts(tools, "rewind:tools"))
        print(
            f"{n:6} tools: dts {dts_t * 1000:7.0f} ms ({size / 1e6:.1f} MB), prompt {prompt_t * 1000:6.0f} ms"
        )


def measure(n: int = 10_000, repeat: int = 2) -> list[Figure]:
    """Rendering both declarations of `n` tools (synthesized from the real catalogues) beside
    serialising the same tools to JSON with orjson (the floor of any rendering)."""
    import orjson

    base = [t for name, listed in load_catalogues().items() for t in tools_from_catalogue(name, listed)]
    if not base:
        why = "no real MCP catalogue could be loaded (npm and .cache/catalogues both missing)"
        return [not_measured(SECTION, f"{kind} of {n:,} tools", "ms", why) for kind in ("dts", "prompt")]
    tools = _synthesize(base, n)
    dumped = [t.model_dump(mode="json", by_alias=True) for t in tools]
    json_ms = _best(lambda: orjson.dumps(dumped), repeat) * 1e3
    label = f"orjson.dumps of the {n:,} tools"
    return [
        Figure(
            SECTION,
            f"render .d.ts of {n:,} tools",
            _best(lambda: render_dts(tools, "rewind:tools"), repeat) * 1e3,
            "ms",
            label,
            json_ms,
        ),
        Figure(
            SECTION,
            f"render prompt of {n:,} tools",
            _best(lambda: render_prompt(tools), repeat) * 1e3,
            "ms",
            label,
            json_ms,
        ),
    ]


if __name__ == "__main__":
    main()
