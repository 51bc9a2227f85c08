"""The type-check gate: generated declarations pass `tsc --noEmit --strict`, every valid call
compiles, and invalid calls that compile are counted (printed, not failed)."""

from __future__ import annotations

import pytest

from tests.catalogues.fetch import last_skipped, load_catalogues
from tests.support.gates import missing
from tests.tsc.edge_cases import edge_tools
from tests.tsc.gate import GateResult, find_tsc, run_gate, tools_from_catalogue

pytestmark = pytest.mark.tsc

TSC = find_tsc()
NO_TSC = "no TypeScript compiler: run `npm install --prefix .cache/npm typescript@7` or set TOOLBUS_TSC"


def needs_tsc() -> str:
    """The compiler; without one the gate skips, or fails in CI."""
    if TSC is None:
        missing(NO_TSC)
    return TSC


def _report(name: str, result: GateResult) -> None:
    print(
        f"\n{name}: {result.tools} tools, {result.valid_calls} valid calls, {result.invalid_calls} invalid calls,"
        f" {len(result.declaration_errors)} declaration errors, {len(result.valid_rejected)} valid rejected,"
        f" {len(result.invalid_accepted)} invalid accepted"
    )
    for line in result.invalid_accepted:
        print(f"  invalid accepted: {line}")


def _assert_clean(result: GateResult) -> None:
    assert result.declaration_errors == []
    assert result.valid_rejected == []
    assert result.other_errors == []


def test_edge_case_corpus_type_checks_and_accepts_every_valid_call() -> None:
    result = run_gate(edge_tools(), needs_tsc())
    _report("edge cases", result)
    _assert_clean(result)
    assert result.valid_calls >= 30
    assert result.invalid_calls >= 30


def test_real_mcp_catalogues_type_check_and_accept_every_valid_call() -> None:
    tsc = needs_tsc()
    catalogues = load_catalogues()
    if not catalogues:
        missing(f"no MCP catalogue could be fetched: {last_skipped}")
    tools = [t for name, listed in catalogues.items() for t in tools_from_catalogue(name, listed)]
    result = run_gate(tools, tsc)
    _report(f"real catalogues ({', '.join(catalogues)})", result)
    _assert_clean(result)
    assert result.valid_calls > 0
