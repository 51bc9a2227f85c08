"""The OAuth endpoints of the credentials service: the redirect endpoint, `GET /oauth/callback`,
which hands the query to `OAuthConnections` and answers the end user with a short page that says
what happened (never a token or the query); the connect links, `GET /oauth/start/<token>`; and
toolbus's Client ID Metadata Document, `GET /oauth/client-metadata.json`."""

from __future__ import annotations

import html
import logging
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from toolbus_common.web_headers import SECURITY_HEADERS

log = logging.getLogger(__name__)

CALLBACK_PATH = "/oauth/callback"
START_PATH = "/oauth/start/{token}"
CLIENT_METADATA_PATH = "/oauth/client-metadata.json"


def _page(title: str, text: str, status: int) -> HTMLResponse:
    body = (
        f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
        "<meta name=viewport content='width=device-width'></head><body>"
        f"<h1>{html.escape(title)}</h1><p>{html.escape(text)}</p></body></html>"
    )
    # The security headers of every page toolbus serves: among them no caching and no referrer
    # (the URL held a code and a state), and no framing.
    return HTMLResponse(body, status_code=status, headers=SECURITY_HEADERS)


def callback_route(handle: Callable[[dict[str, str]], Awaitable[tuple[bool, str]]]) -> Route:
    """`handle(query)` -> (connected, text for the page)."""

    async def callback(request: Request) -> Response:
        params = {k: v for k, v in request.query_params.items()}
        try:
            ok, text = await handle(params)
        except Exception:
            log.exception("oauth callback failed")
            return _page("Not connected", "toolbus could not complete the connection; try again.", 500)
        if ok:
            return _page("Connected", text, 200)
        return _page("Not connected", text, 400)

    return Route(CALLBACK_PATH, callback, methods=["GET"])


def start_route(begin: Callable[[str], Awaitable[str | None]]) -> Route:
    """`GET /oauth/start/<token>`: `begin(token)` -> the authorization server's URL (a redirect),
    or None (the link is unknown, used or expired: a page that says so)."""

    async def start(request: Request) -> Response:
        try:
            url = await begin(request.path_params["token"])
        except Exception:
            log.exception("oauth start failed")
            return _page("Not connected", "toolbus could not start the connection; try again.", 500)
        if url is None:
            return _page(
                "Link expired",
                "This connection link was already used or has expired. Ask for a new one.",
                400,
            )
        return RedirectResponse(url, status_code=302, headers=SECURITY_HEADERS)

    return Route(START_PATH, start, methods=["GET"])


def client_metadata_route(document: Callable[[], dict[str, object] | None]) -> Route:
    """`GET /oauth/client-metadata.json`: toolbus's Client ID Metadata Document (what an
    authorization server fetches for the `client_id` that is this URL), or 404 when the callback
    URL is not HTTPS (no such client id is used then)."""

    async def metadata(request: Request) -> Response:
        body = document()
        if body is None:
            return JSONResponse({"error": "not_found"}, status_code=404)
        return JSONResponse(body, headers={"Cache-Control": "public, max-age=3600"})

    return Route(CLIENT_METADATA_PATH, metadata, methods=["GET"])
