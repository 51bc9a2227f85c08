"""A call as the Redis scripts return it: the fields of its hash, typed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from toolbus_common.redis_values import text as _s


@dataclass(slots=True)
class CallRecord:
    """What a dispatcher needs to run one call; built from its Redis hash."""

    call_id: str
    run_id: str
    tool: str
    input_json: str
    idempotency_key: str
    toolset_id: str
    namespace: str | None
    on_interruption: str
    attempts: int
    state: str

    @property
    def input(self) -> dict[str, Any]:
        value: dict[str, Any] = orjson.loads(self.input_json)
        return value

    @staticmethod
    def from_hash(call_id: str, h: dict[str, str]) -> CallRecord:
        return CallRecord(
            call_id=call_id,
            run_id=h["run"],
            tool=h["tool"],
            input_json=h["input"],
            idempotency_key=h["key"],
            toolset_id=h["ts"],
            namespace=h.get("ns") or None,
            on_interruption=h.get("onint", "retry"),
            attempts=int(h.get("attempts", "0")),
            state=h.get("state", "queued"),
        )

    @staticmethod
    def from_script(item: list[Any]) -> CallRecord:
        """One `{callId, call_fields}` pair of a script's admitted or reaped list (see admit.lua)."""
        run, tool, input_json, key, ts, ns, onint, attempts, state = (
            _s(v) if v is not None else "" for v in item[1]
        )
        return CallRecord(
            call_id=_s(item[0]),
            run_id=run,
            tool=tool,
            input_json=input_json,
            idempotency_key=key,
            toolset_id=ts,
            namespace=ns or None,
            on_interruption=onint or "retry",
            attempts=int(attempts or 0),
            state=state,
        )
