"""What an approval rule costs a call: the dispatcher's verdict for a tool whose `approval` is a
rule (JSON Schema over input, tool and run), beside the input-schema check every call already
pays, on the same input, in alternated rounds in one process; microseconds per call (best round).

    uv run python bench/approval_rules.py [--calls 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from toolbus_contracts.registry import ApprovalRule
from toolbus_dispatcher.approval_rules import ApprovalRules
from toolbus_dispatcher.validation import SchemaCache

INPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "charge": {"type": "string"},
        "amount": {"type": "integer", "minimum": 1},
        "currency": {"type": "string", "enum": ["eur", "usd"]},
    },
    "required": ["charge", "amount"],
    "additionalProperties": False,
}
RULE = ApprovalRule(
    when={
        "properties": {
            "input": {"properties": {"amount": {"minimum": 100}}, "required": ["amount"]},
            "run": {"properties": {"namespace": {"enum": ["prod", "eu-prod"]}}},
        }
    }
)
CALL_INPUT = {"charge": "ch_1", "amount": 500, "currency": "eur"}
RUN = {"runId": "run_1", "namespace": "prod", "toolsetId": "ts_1", "credentials": None}


def per_call(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    schemas, rules = SchemaCache(), ApprovalRules()
    cases: dict[str, Callable[[], Any]] = {
        "input schema check (baseline, every call)": lambda: schemas.check(
            "ts_1", "shop.refund", INPUT_SCHEMA, CALL_INPUT
        ),
        "approval: true (no rule)": lambda: rules.verdict(True, {}),
        "approval rule, matching": lambda: rules.verdict(
            RULE, {"input": CALL_INPUT, "tool": "shop.refund", "run": RUN}
        ),
        "approval rule, not matching": lambda: rules.verdict(
            RULE, {"input": {**CALL_INPUT, "amount": 5}, "tool": "shop.refund", "run": RUN}
        ),
    }
    best = dict.fromkeys(cases, float("inf"))
    for fn in cases.values():
        fn()  # compile and cache
    for _ in range(args.rounds):
        for name, fn in cases.items():
            best[name] = min(best[name], per_call(fn, args.calls))
    for name, us in best.items():
        print(f"{name:<44} {us:7.2f} µs/call")


if __name__ == "__main__":
    main()
