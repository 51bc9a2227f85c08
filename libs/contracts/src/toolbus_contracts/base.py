"""The base of every wire model, the reply envelope's error form, and the parser that turns bad bodies into
`invalidRequest` naming the field."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Annotated, Any, TypeVar

import orjson
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from toolbus_contracts.errors import InvalidRequest, ToolbusError


class WireModel(BaseModel):
    """A frozen contract body: camelCase on the wire, snake_case in Python, unknown fields and
    wrong types refused (strict: `"yes"` is not a boolean, `"5"` is not a number).

    Parse wire bytes with `parse_body` (aliases only); build in Python with either name.
    """

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        strict=True,
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )

    def wire(self) -> dict[str, Any]:
        """The JSON-ready dict of this body, absent optionals left out.

        Python mode, not JSON mode: every field already holds JSON values (free-form fields come
        from JSON), and JSON mode re-walks each `Any` value, ~8x slower on tool schemas."""
        return self.model_dump(exclude_none=True)

    def wire_json(self) -> bytes:
        return self.model_dump_json(exclude_none=True).encode()


def null_as(default: Any) -> BeforeValidator:
    """For an optional field whose default is not null (`limit`, `description`, the lists of a
    spec): `null` on the wire is taken as absent, as for the fields that may be null. A callable
    `default` makes a fresh value each time (a list, a dict)."""
    if callable(default):
        return BeforeValidator(lambda value: default() if value is None else value)
    return BeforeValidator(lambda value: default if value is None else value)


M = TypeVar("M", bound=BaseModel)


def _loc(loc: tuple[int | str, ...]) -> str:
    """`a.b[1].c`; a key of a body's object (a header name, an unknown field) is quoted up to 200
    characters, so that a huge key still gets an error reply of a few hundred bytes."""
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        else:
            parts.append(("." if parts else "") + bounded(part, 200))
    return "".join(parts) or "body"


def validation_to_error(exc: ValidationError) -> InvalidRequest:
    """Turn a pydantic error into `invalidRequest` whose message names the first failing field."""
    errors = exc.errors(include_url=False, include_input=False)
    # An unknown field explains the others (a snake_case name also reads as a missing camelCase one).
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = tuple(
        p for p in first["loc"] if not (isinstance(p, str) and (p.startswith("function-") or p == "[key]"))
    )
    field = _loc(loc)
    kind = first["type"]
    if kind == "json_invalid":
        reason = str(first["msg"]).removeprefix("Invalid JSON: ")
        if "unicode" in reason:  # bytes that are not UTF-8
            reason += " (a body is UTF-8 text)"
        return InvalidRequest(f"The body is not valid JSON: {reason}.", details={"field": "body"})
    if kind == "extra_forbidden":
        msg = f"Unknown field '{field}': remove it."
    elif kind == "missing":
        msg = f"Missing field '{field}': it is required."
    else:
        reason = str(first["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        msg = f"Field '{field}' is invalid: {reason}."
    return InvalidRequest(msg, details={"field": field})


INT_MIN, INT_MAX = -(2**63), 2**64 - 1
"""The integers toolbus carries: what orjson (every store and reply) writes; beyond, it refuses."""


class _NotJson(Exception):
    pass


def _not_json(_text: str) -> Any:
    raise _NotJson


VALUE_DEPTH_MAX = 254
"""The deepest a value toolbus carries may nest (objects and arrays): the deepest orjson writes."""


def unfit_number(value: Any, loc: tuple[int | str, ...] = (), *, ints: bool = True) -> str | None:
    """The path (`input.a[1]`) of the first number in a parsed JSON value (or a Python value that
    JSON writers take: tuples and sets are walked as arrays) that toolbus cannot write back (a
    non-finite float; with `ints`, an integer outside `INT_MIN`..`INT_MAX`), or None. Walked
    without recursion, each shared object once; a value that holds itself or nests deeper than
    `VALUE_DEPTH_MAX` levels is `InvalidRequest` naming where."""
    walking: set[int] = set()  # the containers on the path to the current one
    walked: set[int] = set()  # containers checked whole: a shared one is checked once
    todo: list[tuple[Any, tuple[int | str, ...], bool]] = [(value, loc, False)]
    while todo:
        node, where, leaving = todo.pop()
        if leaving:
            walking.discard(id(node))
            walked.add(id(node))
            continue
        if isinstance(node, bool):
            continue
        if isinstance(node, int):
            if ints and not INT_MIN <= node <= INT_MAX:
                return _loc(where)
            continue
        if isinstance(node, float):
            if node - node != 0:
                return _loc(where)
            continue
        # Tuples and sets too: a caller's Python value, before JSON writers turn them into arrays.
        if not isinstance(node, dict | list | tuple | set | frozenset):
            continue
        if id(node) in walking:
            field = _loc(where)
            raise InvalidRequest(
                f"Field '{field}' holds itself: a JSON value cannot.", details={"field": field}
            )
        if id(node) in walked:
            continue
        if len(where) - len(loc) >= VALUE_DEPTH_MAX:
            field = _loc(where[: len(loc) + 1])
            raise InvalidRequest(
                f"Field '{field}' nests deeper than {VALUE_DEPTH_MAX} levels of objects and arrays.",
                details={"field": field},
            )
        walking.add(id(node))
        todo.append((node, where, True))
        items = node.items() if isinstance(node, dict) else enumerate(node)
        todo.extend(reversed([(item, (*where, key), False) for key, item in items]))
    return None


SCHEMA_DEPTH_MAX = 64
"""The deepest a JSON Schema toolbus checks may nest (objects and arrays, the schema itself being
level 1): real schemas nest a few levels; checking far deeper ones exhausts Python's stack."""


def nesting_depth(value: Any, stop: int = SCHEMA_DEPTH_MAX + 1) -> int:
    """How many levels of objects and arrays `value` nests (a scalar: 0), counted level by level
    without recursion, and no further than `stop`."""
    depth = 0
    level = [value] if isinstance(value, dict | list) else []
    while level and depth < stop:
        depth += 1
        below: list[Any] = []
        for node in level:
            below.extend(
                c for c in (node.values() if isinstance(node, dict) else node) if isinstance(c, dict | list)
            )
        level = below
    return depth


def unfit_number_error(field: str) -> InvalidRequest:
    return InvalidRequest(
        f"Field '{field}' holds a number toolbus cannot carry: JSON numbers must be finite doubles "
        f"or integers from {INT_MIN} to {INT_MAX}.",
        details={"field": field},
    )


def _check_numbers(raw: bytes) -> None:
    """For a body orjson refused: NaN and Infinity (`field: body`), a number that overflows a
    double (`1e400`, which pydantic would take as infinity and JSON writers write as null: naming
    its field), else nothing (malformed JSON: the model's parser says where)."""
    try:
        parsed = json.loads(raw, parse_constant=_not_json)
    except _NotJson:
        # pydantic's parser takes them; JSON has no such numbers (and hashing would turn them to null)
        raise InvalidRequest(
            "The body is not valid JSON: NaN and Infinity are not JSON numbers.", details={"field": "body"}
        ) from None
    except (ValueError, RecursionError):
        return  # not JSON, or nested too deep to read so: the model's parser says what is wrong
    field = unfit_number(parsed)
    if field is not None:
        raise unfit_number_error(field)


def parse_body(model: type[M], data: bytes | str) -> M:
    """Parse a wire body strictly by its camelCase names, or raise `InvalidRequest` naming the field."""
    if not data or not str(data if isinstance(data, str) else data[:1]).strip():
        raise InvalidRequest("The body is empty: send a JSON object.", details={"field": "body"})
    raw = data.encode() if isinstance(data, str) else data
    try:
        orjson.loads(raw)  # ~0.5 µs for a call's body: refuses NaN, Infinity and 1e400, as JSON does
    except orjson.JSONDecodeError:
        _check_numbers(raw)  # which of them, and where (malformed JSON: the model's parser says)
    try:
        return model.model_validate_json(data, by_alias=True, by_name=False)
    except ValidationError as exc:
        raise validation_to_error(exc) from None


def reply_error(error: ToolbusError) -> dict[str, Any]:
    return {"ok": False, "error": error.to_wire()}


def bounded(value: str, limit: int = 80) -> str:
    """A value as quoted in an error message: at most `limit` characters, so a huge one gives a
    small reply."""
    return value if len(value) <= limit else value[:limit] + "…"


# ---- Durations ---------------------------------------------------------------------------------

_DURATION_RE = re.compile(r"^(?:([0-9]+(?:\.[0-9]+)?)(ms|h|m|s))+$")  # ASCII digits only
_PART_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|h|m|s)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


DURATION_MAX_HOURS = 8760
"""The longest duration taken anywhere (365 days): longer ones (up to what would overflow a
timer) are refused as mistakes, not kept as timeouts nobody will see end."""


def parse_duration(text: str) -> timedelta:
    """Parse `"500ms"`, `"60s"`, `"5m"`, `"1h30m"`; zero, negative, malformed or longer than
    `DURATION_MAX_HOURS` raise ValueError (quoting at most 40 characters of it)."""
    shown = bounded(text, 40) if isinstance(text, str) else text
    if not isinstance(text, str) or not _DURATION_RE.fullmatch(text):
        raise ValueError(f"'{shown}' is not a duration such as 500ms, 60s, 5m or 1h30m")
    seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _PART_RE.findall(text))
    if seconds <= 0:
        raise ValueError(f"'{shown}' must be longer than zero")
    if seconds > DURATION_MAX_HOURS * 3600:
        raise ValueError(f"'{shown}' is longer than the longest duration taken, {DURATION_MAX_HOURS}h")
    return timedelta(seconds=seconds)


def duration_seconds(text: str) -> float:
    return parse_duration(text).total_seconds()


def _check_duration(text: str) -> str:
    parse_duration(text)
    return text


Duration = Annotated[str, AfterValidator(_check_duration)]
"""A duration string on the wire, checked to be positive."""
