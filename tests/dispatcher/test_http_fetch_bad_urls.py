"""http.fetch with URLs the HTTP client would not send, found by tests/system/test_fuzz_calls.py (each
ended the call `internal`): a control character in the input URL, a URL over httpx's 64 KiB. Each
is refused as `hostNotAllowed` ("not a valid URL") before anything is sent. A redirect whose
`Location` does not parse or has a control character never reaches the allow-list: httpx (which
builds the next request of every redirect even when it follows none) or h11 refuses the answer,
an interruption as any answer that is not HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import pytest_asyncio
from toolbus_common.egress import EgressPolicy
from toolbus_contracts.errors import HostNotAllowed
from toolbus_devstack import DEV_EGRESS_ALLOW
from toolbus_dispatcher.executors.base import Attempt, Interrupted
from toolbus_dispatcher.executors.http import HttpExecutor
from toolbus_dispatcher.records import CallRecord

from tests.support.http_servers import serve_in_thread

pytestmark = pytest.mark.integration

SEEN: list[str] = []


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        SEEN.append(self.path)
        locations = {"/hop-bad": "http://[::1", "/hop-ctl": "/ok\x01x"}
        self.send_response(302 if self.path in locations else 200)
        if self.path in locations:
            self.send_header("Location", locations[self.path])
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with serve_in_thread(ThreadingHTTPServer(("127.0.0.1", 0), _Handler)) as p:
        yield p


@pytest_asyncio.fixture(loop_scope="session")
async def fetcher() -> AsyncIterator[HttpExecutor]:
    executor = HttpExecutor(max_body=1 << 20, max_redirects=5, egress=EgressPolicy.parse(DEV_EGRESS_ALLOW))
    try:
        yield executor
    finally:
        await executor.aclose()


def _attempt(url: str) -> Attempt:
    call = CallRecord(
        "call_x", "run_x", "http.fetch", "{}", "key-1", "ts_bad_urls", None, "retry", 1, "running"
    )
    return Attempt(call, None, 1, {"url": url}, 10.0, ("127.0.0.1",))  # type: ignore[arg-type]  # no Tool field read


@pytest.mark.parametrize("path", ["/ok#frag\x00", "/\x01\x03", "/a\x7f", "/" + "p" * 70_000])
async def test_an_input_url_the_client_would_not_send_is_refused_and_nothing_is_sent(
    fetcher: HttpExecutor, port: int, path: str
) -> None:
    SEEN.clear()
    with pytest.raises(HostNotAllowed, match="not a valid URL"):
        await fetcher.execute(_attempt(f"http://127.0.0.1:{port}{path}"))
    assert SEEN == []


@pytest.mark.parametrize("path", ["/hop-bad", "/hop-ctl"])
async def test_a_redirect_to_a_location_the_client_refuses_is_an_interruption(
    fetcher: HttpExecutor, port: int, path: str
) -> None:
    SEEN.clear()
    with pytest.raises(Interrupted):
        await fetcher.execute(_attempt(f"http://127.0.0.1:{port}{path}"))
    assert [path] == SEEN
