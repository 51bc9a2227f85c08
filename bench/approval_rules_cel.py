"""Why approval rules are JSON Schema and not CEL: one rule (amount >= 100 in prod or eu-prod)
evaluated by jsonschema (what toolbus uses) and by the two maintained CEL packages on PyPI,
`common-expression-language` (Rust) and `cel-python` (pure Python), in one run; microseconds per
evaluation (best of 3 rounds). The CEL packages are not toolbus dependencies:

    uv run --with common-expression-language --with cel-python python bench/approval_rules_cel.py
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jsonschema

SUBJECT = {
    "input": {"charge": "ch_1", "amount": 500, "currency": "eur"},
    "tool": "shop.refund",
    "run": {"runId": "run_1", "namespace": "prod", "toolsetId": "ts_1", "credentials": "namespace"},
}
SCHEMA = {
    "properties": {
        "input": {"properties": {"amount": {"minimum": 100}}, "required": ["amount"]},
        "run": {"properties": {"namespace": {"enum": ["prod", "eu-prod"]}}},
    }
}
EXPR = 'input.amount >= 100 && run.namespace in ["prod", "eu-prod"]'


def per_eval(fn: Callable[[], Any], n: int) -> float:
    fn()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


def main() -> None:
    validator = jsonschema.Draft202012Validator(SCHEMA)
    print(f"jsonschema (toolbus)            {per_eval(lambda: validator.is_valid(SUBJECT), 20000):7.2f} µs")
    try:
        import cel  # type: ignore[import-not-found]

        program = cel.compile(EXPR)
        print(f"common-expression-language      {per_eval(lambda: program.execute(SUBJECT), 20000):7.2f} µs")
    except ImportError:
        print("common-expression-language      not installed")
    try:
        import celpy  # type: ignore[import-not-found]

        env = celpy.Environment()
        prg = env.program(env.compile(EXPR))
        print(
            f"cel-python (with json_to_cel)   {per_eval(lambda: prg.evaluate(celpy.json_to_cel(SUBJECT)), 2000):7.2f} µs"
        )
    except ImportError:
        print("cel-python                      not installed")


if __name__ == "__main__":
    main()
