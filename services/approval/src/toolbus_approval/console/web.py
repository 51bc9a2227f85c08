"""The console's HTTP app: who the signed-in person is (from the session), pages rendered from
the templates, and the routes of `signin` and `pages` behind the session and `security.Guard`
middleware. No logic of approvals here: the pages call the same `Approvals` methods as the NATS
handlers."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from toolbus_approval.approvals import Approvals
from toolbus_approval.console import pages, signin
from toolbus_approval.console.access import EVERYTHING, Grants, Person
from toolbus_approval.console.declarations import Declarations
from toolbus_approval.console.live import LiveHub
from toolbus_approval.console.oidc import OidcClient
from toolbus_approval.console.security import Guard, csrf_token, new_csrf_token

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
COOKIE = "toolbus_console"
SESSION_SECONDS = 8 * 3600


@dataclass
class ConsoleConfig:
    """What the console is served with (from `ConsoleSettings`, read once)."""

    public_url: str
    session_key: str
    dev_token: str | None
    grants: Grants


class Console:
    """The web console of one approval service process."""

    def __init__(
        self,
        approvals: Approvals,
        config: ConsoleConfig,
        *,
        oidc: OidcClient | None,
        hub: LiveHub,
        declarations: Declarations,
    ) -> None:
        self.approvals = approvals
        self.config = config
        self.oidc = oidc
        self.hub = hub
        self.declarations = declarations
        self.base = urlsplit(config.public_url).path.rstrip("/")
        self._env = Environment(
            loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True)
        )

    # ---- people --------------------------------------------------------------------------------

    def person(self, request: Request) -> Person | None:
        session = request.session
        subject = session.get("sub")
        if not isinstance(subject, str):
            return None
        groups = tuple(str(g) for g in session.get("groups", []))
        grants = (EVERYTHING,) if session.get("dev") else self.config.grants.of(groups)
        return Person(subject=subject, name=str(session.get("name", subject)), groups=groups, grants=grants)

    def sign_in(self, request: Request, subject: str, name: str, groups: tuple[str, ...], dev: bool) -> None:
        request.session.clear()
        request.session.update(
            {
                "sub": subject,
                "name": name,
                "groups": list(groups),
                "dev": dev,
                "csrf": new_csrf_token(),
            }
        )

    # ---- rendering -----------------------------------------------------------------------------

    def page(self, request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        person = self.person(request)
        text = self._env.get_template(template).render(
            base=self.base,
            csrf=csrf_token(request),
            person=person,
            # A fragment (`_*.html`, fetched by the page's script) leaves the message to the page:
            # fetched while a decision's redirect loads, it would take the message first.
            flash=None if template.startswith("_") else request.session.pop("flash", None),
            oidc=self.oidc is not None,
            dev_login=self.config.dev_token is not None,
            **context,
        )
        return HTMLResponse(text, status_code=status)

    # ---- routes --------------------------------------------------------------------------------

    def app(self) -> ASGIApp:
        """The console under the public URL's path, every answer through `security.Guard`."""
        routes = [
            *pages.routes(self),
            *signin.routes(self),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]
        session = Middleware(
            SessionMiddleware,
            secret_key=self.config.session_key,
            session_cookie=COOKIE,
            max_age=SESSION_SECONDS,
            same_site="lax",
            https_only=self.config.public_url.startswith("https://"),
        )
        inner = Starlette(routes=routes, middleware=[session])
        return Guard(Starlette(routes=[Mount(self.base, inner)]) if self.base else inner)
