"""Signing in and out of the console: the page, the OpenID Connect redirect and its return, the
development token, sign-out. A session holds who the person is and a CSRF token, nothing more."""

from __future__ import annotations

import hmac
import logging
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from toolbus_approval.console.oidc import SignInFailed
from toolbus_approval.console.security import csrf_ok

if TYPE_CHECKING:
    from toolbus_approval.console.web import Console

log = logging.getLogger(__name__)

DEV_SUBJECT = "dev"


def routes(c: Console) -> list[Route]:
    """`/login`, `/login/oidc`, `/auth/callback` (the OIDC redirect URI), `/login/dev`, `/logout`."""

    async def login(request: Request) -> Response:
        return c.page(request, "login.html", error=None)

    async def login_oidc(request: Request) -> Response:
        if c.oidc is None:
            return c.page(request, "login.html", 404, error="No OpenID Connect provider is configured.")
        try:
            url, state = await c.oidc.begin()
        except Exception as exc:
            log.warning("console sign-in not started", extra={"error": type(exc).__name__})
            return c.page(
                request, "login.html", 502, error="The sign-in provider does not answer; try again."
            )
        request.session["login_state"] = state
        return RedirectResponse(url, status_code=303)

    async def callback(request: Request) -> Response:
        if c.oidc is None:
            return c.page(request, "login.html", 404, error="No OpenID Connect provider is configured.")
        expected = request.session.pop("login_state", None)
        try:
            claims = await c.oidc.complete(dict(request.query_params), expected)
        except SignInFailed as exc:
            return c.page(request, "login.html", 400, error=f"Not signed in: {exc}.")
        except Exception as exc:
            log.warning("console sign-in failed", extra={"error": type(exc).__name__})
            return c.page(request, "login.html", 502, error="Not signed in: the provider did not answer.")
        c.sign_in(request, claims.subject, claims.name, claims.groups, dev=False)
        log.info("console: signed in", extra={"decider": f"console:{claims.subject}"})
        return RedirectResponse(f"{c.base}/", status_code=303)

    async def login_dev(request: Request) -> Response:
        form = await request.form()
        if not csrf_ok(request, form):
            return c.page(request, "login.html", 403, error="The form was stale; sign in again.")
        token, expected = str(form.get("token", "")), c.config.dev_token
        if expected is None or not hmac.compare_digest(token.encode(), expected.encode()):
            return c.page(request, "login.html", 403, error="That is not the development token.")
        c.sign_in(request, DEV_SUBJECT, "development token", (), dev=True)
        return RedirectResponse(f"{c.base}/", status_code=303)

    async def logout(request: Request) -> Response:
        form = await request.form()
        if not csrf_ok(request, form):
            return c.page(request, "message.html", 403, title="Refused", text="Missing or wrong CSRF token.")
        request.session.clear()
        return RedirectResponse(f"{c.base}/login", status_code=303)

    return [
        Route("/login", login),
        Route("/login/oidc", login_oidc),
        Route("/login/dev", login_dev, methods=["POST"]),
        Route("/auth/callback", callback),
        Route("/logout", logout, methods=["POST"]),
    ]
