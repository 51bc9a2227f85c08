"""Route tables: what one part of a service serves and publishes, declared by its handlers."""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, get_type_hints

from nats.aio.msg import Msg
from pydantic import BaseModel
from toolbus_contracts import Subjects

from toolbus_common.framework.replies import Result

D = TypeVar("D")

SubjectOf = Callable[[Subjects], str]


@dataclass(frozen=True, slots=True)
class Entry:
    kind: str  # request, deferred, command, listen, event
    subject: SubjectOf
    handler: Callable[..., Awaitable[Any]] | None
    model: type[BaseModel]
    reply: type[BaseModel] | None = None
    fast: bool = False
    durable: str = ""
    queue: str | None = None
    service: str = ""
    description: str = ""


def _models(fn: Callable[..., Any], arg: int) -> tuple[type[BaseModel], type[BaseModel] | None]:
    hints = get_type_hints(fn)
    params = list(inspect.signature(fn).parameters)
    model = hints[params[arg]]
    reply = hints.get("return")
    reply_model = reply if isinstance(reply, type) and issubclass(reply, BaseModel) else None
    return model, reply_model


def _doc(fn: Callable[..., Any]) -> str:
    return inspect.cleandoc(fn.__doc__ or "")


REQUEST_HEADERS: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("request_headers")
"""The NATS headers of the request a handler is serving (empty when it had none): for the few
handlers that read one (the approval service's `Nats-Request-Info`)."""


@dataclass
class Routes(Generic[D]):
    """What one part of a service serves and publishes; handlers take the bound object first.
    `service` names the consumer side of commands in the AsyncAPI document (two services may
    consume one subject, each with its durable consumer)."""

    service: str
    entries: list[Entry] = field(default_factory=list)

    def request(
        self, subject: SubjectOf, *, fast: bool = False, reply: type[BaseModel] | None = None
    ) -> Callable[[Callable[[D, Any], Awaitable[Result]]], Callable[[D, Any], Awaitable[Result]]]:
        def add(fn: Callable[[D, Any], Awaitable[Result]]) -> Callable[[D, Any], Awaitable[Result]]:
            model, returned = _models(fn, 1)
            self.entries.append(
                Entry(
                    "request",
                    subject,
                    fn,
                    model,
                    reply or returned,
                    fast,
                    service=self.service,
                    description=_doc(fn),
                )
            )
            return fn

        return add

    def deferred(
        self, subject: SubjectOf, *, reply: type[BaseModel]
    ) -> Callable[[Callable[[D, Any, str], Awaitable[Result]]], Callable[[D, Any, str], Awaitable[Result]]]:
        def add(fn: Callable[[D, Any, str], Awaitable[Result]]) -> Callable[[D, Any, str], Awaitable[Result]]:
            model, _ = _models(fn, 1)
            self.entries.append(
                Entry("deferred", subject, fn, model, reply, True, service=self.service, description=_doc(fn))
            )
            return fn

        return add

    def command(
        self, subject: SubjectOf, *, durable: str
    ) -> Callable[[Callable[[D, Any], Awaitable[None]]], Callable[[D, Any], Awaitable[None]]]:
        def add(fn: Callable[[D, Any], Awaitable[None]]) -> Callable[[D, Any], Awaitable[None]]:
            model, _ = _models(fn, 1)
            self.entries.append(
                Entry(
                    "command", subject, fn, model, durable=durable, service=self.service, description=_doc(fn)
                )
            )
            return fn

        return add

    def listen(
        self, subject: SubjectOf, model: type[BaseModel], *, queue: str | None = None
    ) -> Callable[[Callable[[D, Msg], Awaitable[None]]], Callable[[D, Msg], Awaitable[None]]]:
        def add(fn: Callable[[D, Msg], Awaitable[None]]) -> Callable[[D, Msg], Awaitable[None]]:
            self.entries.append(Entry("listen", subject, fn, model, queue=queue, description=_doc(fn)))
            return fn

        return add

    def event(self, subject: SubjectOf, model: type[BaseModel], description: str) -> None:
        self.entries.append(Entry("event", subject, None, model, description=inspect.cleandoc(description)))
