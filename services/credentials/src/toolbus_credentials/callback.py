"""The OAuth redirect endpoint, `GET /oauth/callback`: hands the query to `OAuthConnections` and
answers the end user with a short page that says what happened (never a token or the query)."""

from __future__ import annotations

import html
import logging
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

log = logging.getLogger(__name__)

CALLBACK_PATH = "/oauth/callback"


def _page(title: str, text: str, status: int) -> HTMLResponse:
    body = (
        f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
        "<meta name=viewport content='width=device-width'></head>"
        "<body style='font-family:sans-serif;max-width:36em;margin:4em auto'>"
        f"<h1>{html.escape(title)}</h1><p>{html.escape(text)}</p></body></html>"
    )
    # No caching and no referrer: the URL held a code and a state.
    headers = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}
    return HTMLResponse(body, status_code=status, headers=headers)


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
