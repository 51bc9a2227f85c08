"""Host tools declared once, in Python: `@host_tool` turns an async function into its schemas
(from its type hints or pydantic models) and into the `host` entry `toolsets.create` registers,
so what the registry pins and what the worker runs come from the same declaration."""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, overload

from pydantic import BaseModel, TypeAdapter, ValidationError, create_model
from toolbus_contracts import HostToolSpec, PolicySpec

from toolbus._core import build


@dataclass(frozen=True)
class CallContext:
    """What a host tool may want to know about the attempt it runs: the idempotency key (the same
    for every attempt of one call: use it to make side effects happen once) and the attempt number."""

    call_id: str
    attempt: int
    idempotency_key: str
    run_id: str
    namespace: str | None
    toolset_id: str
    tool: str


ToolFunction = Callable[..., Awaitable[Any]]


class HostTool:
    """An async function served as a host tool (made by `@host_tool`; call it as the function)."""

    def __init__(
        self,
        fn: ToolFunction,
        *,
        name: str | None = None,
        description: str | None = None,
        policy: PolicySpec | Mapping[str, Any] | None = None,
    ) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"host tool {fn.__name__} must be an async function")
        self.fn = fn
        self.name = name or fn.__name__
        self.description = description if description is not None else inspect.cleandoc(fn.__doc__ or "")
        self.policy = build(PolicySpec, **dict(policy)) if isinstance(policy, Mapping) else policy
        hints = typing.get_type_hints(fn, include_extras=True)
        params = list(inspect.signature(fn).parameters.values())
        self._context_param = next((p.name for p in params if hints.get(p.name) is CallContext), None)
        inputs = [p for p in params if p.name != self._context_param]
        self._model_param: str | None = None
        if len(inputs) == 1 and _is_model(hints.get(inputs[0].name)):
            self._model_param = inputs[0].name
            self._input_model: type[BaseModel] = hints[inputs[0].name]
        else:
            fields: dict[str, Any] = {
                p.name: (hints.get(p.name, Any), ... if p.default is inspect.Parameter.empty else p.default)
                for p in inputs
            }
            self._input_model = create_model(f"{self.name.replace('.', '_')}_input", **fields)
        self.input_schema: dict[str, Any] = self._input_model.model_json_schema()
        returns = hints.get("return", Any)
        self._output: TypeAdapter[Any] | None = (
            None if returns in (Any, None, type(None)) else TypeAdapter(returns)
        )
        self.output_schema: dict[str, Any] | None = self._output.json_schema() if self._output else None

    def __repr__(self) -> str:
        return f"HostTool({self.name!r})"

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return await self.fn(*args, **kwargs)

    def spec(self) -> HostToolSpec:
        """The `host` entry of `toolsets.create` for this tool."""
        return build(
            HostToolSpec,
            name=self.name,
            description=self.description,
            input_schema=self.input_schema,
            output_schema=self.output_schema,
            policy=self.policy,
        )

    async def invoke(self, input: dict[str, Any], context: CallContext) -> Any:
        """Run the function on a call's input; returns the output as JSON values. An input its
        schema refuses raises `ValueError` naming the field."""
        try:
            parsed = self._input_model.model_validate(input)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"]) or "input"
            raise ValueError(f"input field '{where}': {first['msg']}") from None
        kwargs: dict[str, Any] = (
            {self._model_param: parsed}
            if self._model_param
            else {name: getattr(parsed, name) for name in type(parsed).model_fields}
        )
        if self._context_param:
            kwargs[self._context_param] = context
        output = await self.fn(**kwargs)
        adapter = self._output if self._output is not None else TypeAdapter(Any)
        dumped = adapter.dump_python(output, mode="json")
        # JSON mode writes a NaN or an infinity as null: only an output with a null in it can hide
        # one, and only that one is dumped again as Python values to look.
        if _has(dumped, lambda v: v is None) and _has(adapter.dump_python(output), _non_finite):
            raise ValueError("output is not JSON: NaN and Infinity are not JSON numbers")
        return dumped


def _non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _has(value: Any, test: Callable[[Any], bool]) -> bool:
    """Whether test holds for value or any value nested in its dicts, lists, tuples and sets."""
    if test(value):
        return True
    if isinstance(value, dict):
        return any(_has(v, test) for v in value.values())
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_has(v, test) for v in value)
    return False


def _is_model(annotation: Any) -> bool:
    return inspect.isclass(annotation) and issubclass(annotation, BaseModel)


@overload
def host_tool(fn: ToolFunction, /) -> HostTool: ...


@overload
def host_tool(
    *,
    name: str | None = None,
    description: str | None = None,
    policy: PolicySpec | Mapping[str, Any] | None = None,
) -> Callable[[ToolFunction], HostTool]: ...


def host_tool(
    fn: ToolFunction | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    policy: PolicySpec | Mapping[str, Any] | None = None,
) -> HostTool | Callable[[ToolFunction], HostTool]:
    """Declare an async function as a host tool.

        @host_tool(name="crm.find_customer", policy={"onInterruption": "at_most_once"})
        async def find_customer(email: str, ctx: CallContext) -> Customer:
            '''Find a customer by email.'''

    The input schema comes from the parameters (or from the one pydantic model parameter), the
    output schema from the return annotation, the description from the docstring. A parameter typed
    `CallContext` receives the attempt's context and is not part of the input.
    """
    if fn is not None:
        return HostTool(fn, name=name, description=description, policy=policy)

    def decorate(f: ToolFunction) -> HostTool:
        return HostTool(f, name=name, description=description, policy=policy)

    return decorate
