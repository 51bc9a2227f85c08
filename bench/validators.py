"""Input validation bench: toolbus's validator (`SchemaCache`: the `schema_fast` accept in front of
jsonschema with RE2 patterns) beside jsonschema alone, fastjsonschema and jsonschema-rs, on the
schemas of the real npm MCP catalogues (tests/catalogues) and a 1,000-tool catalogue made of them.

Per engine: µs to accept a valid input of a typical tool (`filesystem.read_text_file`, else the
first), µs to refuse one (a required property missing), and for the 1,000-tool catalogue the ms to
compile every schema and the µs per tool to accept one valid input each. `unchecked` counts the
schemas an engine cannot take (fastjsonschema has no draft 2020-12 keywords; a schema it fails to
compile is left out of its figures).

    uv run python bench/validators.py [--tools 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fastjsonschema
import jsonschema_rs
from toolbus_contracts.errors import InvalidInput
from toolbus_dispatcher.validation import SchemaCache

from tests.catalogues.fetch import last_skipped, load_catalogues

Check = Callable[[dict[str, Any]], bool]
TYPICAL = "filesystem.read_text_file"


def sample(schema: Any, depth: int = 0) -> Any:
    """A value the schema probably accepts: its required properties, each a plain value of its type."""
    if not isinstance(schema, dict) or depth > 8:
        return None
    if schema.get("enum"):
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    if "default" in schema:
        return copy.deepcopy(schema["default"])
    for alt in ("anyOf", "oneOf"):
        if schema.get(alt):
            return sample(schema[alt][0], depth + 1)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties", {})
        return {name: sample(props.get(name, {}), depth + 1) for name in schema.get("required", [])}
    if kind == "array":
        least = int(schema.get("minItems", 0))
        return [sample(schema.get("items", {}), depth + 1) for _ in range(least)]
    if kind == "string":
        return "a" * max(1, int(schema.get("minLength", 1)))
    if kind == "integer":
        return max(1, int(schema.get("minimum", 1)))
    if kind == "number":
        return float(schema.get("minimum", 1.5))
    if kind == "boolean":
        return True
    return None


def toolbus(schema: dict[str, Any], cache: SchemaCache, key: str) -> Check:
    def check(value: dict[str, Any]) -> bool:
        try:
            cache.check("ts", key, schema, value)
        except InvalidInput:
            return False
        return True

    check({})  # compile now (the cache compiles on first use)
    return check


def jsonschema_alone(schema: dict[str, Any], cache: SchemaCache, key: str) -> Check:
    compiled = cache.compiled("js", key, schema)
    assert compiled is not None
    validator = compiled[0]
    return lambda value: not any(True for _ in validator.iter_errors(value))


def fast(schema: dict[str, Any], _cache: SchemaCache, _key: str) -> Check:
    validate = fastjsonschema.compile(schema)

    def check(value: dict[str, Any]) -> bool:
        try:
            validate(value)
        except fastjsonschema.JsonSchemaException:
            return False
        return True

    return check


def rs(schema: dict[str, Any], _cache: SchemaCache, _key: str) -> Check:
    return jsonschema_rs.validator_for(schema).is_valid


ENGINES: dict[str, Callable[[dict[str, Any], SchemaCache, str], Check]] = {
    "toolbus (jsonschema-rs accept + judge)": toolbus,
    "jsonschema/RE2 alone": jsonschema_alone,
    "fastjsonschema": fast,
    "jsonschema-rs": rs,
}


def per_call(check: Check, value: dict[str, Any], rounds: int, n: int = 20_000) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            check(value)
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tools", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    catalogues = load_catalogues()
    for name, reason in last_skipped.items():
        print(f"skipped {name}: {reason}")
    judge = SchemaCache()
    tools: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    for server, listed in catalogues.items():
        for t in listed:
            schema = t.get("inputSchema") or {"type": "object"}
            value = sample(schema)
            name = f"{server}.{t['name']}"
            try:
                judge.check("ts", name, schema, value)  # the dispatcher's verdict decides what is valid
            except InvalidInput:
                continue
            tools.append((name, schema, value))
    if not tools:
        sys.exit("no catalogue could be loaded (tests/catalogues): nothing to measure")
    typical = next((t for t in tools if t[0] == TYPICAL), tools[0])
    print(f"{len(tools)} real tools with a valid sample input; typical: {typical[0]} {typical[2]}")
    catalogue = [
        (
            f"s{i}_{tools[i % len(tools)][0]}",
            copy.deepcopy(tools[i % len(tools)][1]),
            tools[i % len(tools)][2],
        )
        for i in range(args.tools)
    ]
    header = (
        f"{'engine':40} {'valid µs':>9} {'invalid µs':>10} {'compile ms':>10} {'µs/tool':>8} {'unchecked':>9}"
    )
    print(f"{args.tools}-tool catalogue; best of {args.rounds} rounds")
    print(header)
    for label, make in ENGINES.items():
        cache = SchemaCache(size=args.tools * 2)
        name, schema, value = typical
        check = make(copy.deepcopy(schema), cache, name)
        assert check(value), f"{label} refuses the typical valid input"
        missing = {k: v for k, v in list(value.items())[1:]}
        valid_us = per_call(check, value, args.rounds)
        invalid_us = per_call(check, missing, args.rounds, 5_000) if not check(missing) else float("nan")
        start = time.perf_counter()
        checks: list[tuple[Check, dict[str, Any]]] = []
        unchecked = 0
        for key, sch, val in catalogue:
            try:
                checks.append((make(sch, cache, key), val))
            except Exception:
                unchecked += 1
        compile_ms = (time.perf_counter() - start) * 1e3
        best = float("inf")
        for _ in range(args.rounds):
            start = time.perf_counter()
            for c, val in checks:
                c(val)
            best = min(best, time.perf_counter() - start)
        rejected = sum(1 for c, val in checks if not c(val))
        print(
            f"{label:40} {valid_us:9.2f} {invalid_us:10.2f} {compile_ms:10.0f} "
            f"{best / max(1, len(checks)) * 1e6:8.2f} {unchecked:9}"
            + (f"  ({rejected} valid inputs refused)" if rejected else "")
        )


if __name__ == "__main__":
    main()
