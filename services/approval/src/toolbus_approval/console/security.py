"""What every console answer and form carries: the security headers (`toolbus_common.web_headers`),
a bound on request bodies, and the per-session CSRF token every POST must present."""

from __future__ import annotations

import hmac
import secrets
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from toolbus_common.web_headers import SECURITY_HEADERS as WEB_SECURITY_HEADERS

SECURITY_HEADERS = [(name.encode(), value.encode()) for name, value in WEB_SECURITY_HEADERS.items()]
BODY_MAX = 1 << 20
"""Bytes a request body may have (a form with an edited input, a check): more is 413."""
TOO_LARGE = "Request body too large."


class Guard:
    """ASGI middleware: the security headers on every answer; a body over `BODY_MAX` refused."""

    def __init__(self, app: ASGIApp, body_max: int = BODY_MAX) -> None:
        self.app = app
        self.body_max = body_max

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in SECURITY_HEADERS}
                kept = [(n, v) for n, v in message.get("headers", []) if n.lower() not in names]
                message["headers"] = kept + SECURITY_HEADERS
            await send(message)

        length = dict(scope["headers"]).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.body_max:
            await PlainTextResponse(TOO_LARGE, status_code=413)(scope, receive, with_headers)
            return
        received = 0

        async def bounded() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.body_max:  # a chunked body longer than it may be: the app answers 413
                raise HTTPException(413, TOO_LARGE)
            return message

        await self.app(scope, bounded, with_headers)


def csrf_token(request: Request) -> str:
    """The session's CSRF token, made on first use (a session without one gets one)."""
    token = request.session.get("csrf")
    if not isinstance(token, str):
        token = request.session["csrf"] = secrets.token_urlsafe(32)
    return token


def new_csrf_token() -> str:
    return secrets.token_urlsafe(32)


def csrf_ok(request: Request, form: Any | None = None) -> bool:
    """The request carries the session's CSRF token (form field `csrf` or header `X-CSRF-Token`),
    compared in constant time; a request without a session has none to match."""
    expected = request.session.get("csrf")
    given = request.headers.get("x-csrf-token")
    if given is None and form is not None:
        given = form.get("csrf")
    if not isinstance(expected, str) or not isinstance(given, str):
        return False
    return hmac.compare_digest(given.encode(), expected.encode())
