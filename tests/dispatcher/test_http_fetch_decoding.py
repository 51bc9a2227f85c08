"""`http.fetch` decodes compressed bodies within the output cap, against a real HTTP server: gzip
and deflate (zlib-wrapped and raw) bodies come back decoded, the request asks for `gzip, deflate`
unless the input sets `Accept-Encoding`, and a gzip bomb over the cap (100 MB of zeros, ~100 KB on
the wire) is `outputTooLarge` with Python's allocations staying near the cap (tracemalloc's peak:
httpx decoding one 64 KiB read whole was 64 MiB, the audit saw RSS go from 79 to 211 MiB)."""

from __future__ import annotations

import contextlib
import gzip
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import pytest_asyncio
from toolbus_common.egress import EgressPolicy
from toolbus_contracts.errors import OutputTooLarge, UpstreamError
from toolbus_devstack import DEV_EGRESS_ALLOW
from toolbus_dispatcher.executors.base import Attempt
from toolbus_dispatcher.executors.http import HttpExecutor
from toolbus_dispatcher.records import CallRecord

from tests.support.http_servers import serve_in_thread

pytestmark = pytest.mark.integration

CAP = 1 << 20
TEXT = b"hello, compressed world " * 2000


def _bomb() -> bytes:
    co = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    zeros = b"\0" * (1 << 20)
    return b"".join(co.compress(zeros) for _ in range(100)) + co.flush()


BOMB = _bomb()
_raw = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
BODIES: dict[str, tuple[str, bytes]] = {
    "/gzip": ("gzip", gzip.compress(TEXT)),
    "/deflate": ("deflate", zlib.compress(TEXT)),
    "/raw-deflate": ("deflate", _raw.compress(TEXT) + _raw.flush()),
    "/twice": ("gzip, gzip", gzip.compress(gzip.compress(TEXT))),
    "/bomb": ("gzip", BOMB),
    "/broken": ("gzip", b"\x1f\x8b not gzip at all"),
}
SEEN: list[str | None] = []


class _Compressed(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        SEEN.append(self.headers.get("Accept-Encoding"))
        coding, body = BODIES[self.path]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Encoding", coding)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(body)


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with serve_in_thread(ThreadingHTTPServer(("127.0.0.1", 0), _Compressed)) as p:
        yield p


@pytest_asyncio.fixture(loop_scope="session")
async def fetcher() -> AsyncIterator[HttpExecutor]:
    executor = HttpExecutor(max_body=CAP, max_redirects=0, egress=EgressPolicy.parse(DEV_EGRESS_ALLOW))
    try:
        yield executor
    finally:
        await executor.aclose()


def _attempt(port: int, path: str, headers: dict[str, str] | None = None) -> Attempt:
    call = CallRecord("call_x", "run_x", "http.fetch", "{}", "key-1", "ts_local", None, "retry", 1, "running")
    inp: dict[str, Any] = {"url": f"http://127.0.0.1:{port}{path}"}
    if headers is not None:
        inp["headers"] = headers
    return Attempt(call, None, 1, inp, 10.0, ("127.0.0.1",))  # type: ignore[arg-type]  # no Tool field read


@pytest.mark.parametrize("path", ["/gzip", "/deflate", "/raw-deflate", "/twice"])
async def test_compressed_bodies_come_back_decoded(fetcher: HttpExecutor, port: int, path: str) -> None:
    out = await fetcher.execute(_attempt(port, path))
    assert out["status"] == 200 and out["bodyEncoding"] == "text"
    assert out["body"] == TEXT.decode()
    assert SEEN[-1] == "gzip, deflate"


async def test_the_input_s_accept_encoding_is_sent_as_it_is(fetcher: HttpExecutor, port: int) -> None:
    out = await fetcher.execute(_attempt(port, "/gzip", {"Accept-Encoding": "gzip"}))
    assert out["body"] == TEXT.decode() and SEEN[-1] == "gzip"


async def test_a_gzip_bomb_over_the_cap_is_output_too_large_within_bounded_memory(
    fetcher: HttpExecutor, port: int
) -> None:
    assert len(BOMB) < CAP // 4  # small on the wire: only its decoded size is over the cap
    tracemalloc.start()
    try:
        with pytest.raises(OutputTooLarge) as err:
            await fetcher.execute(_attempt(port, "/bomb"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert err.value.details == {"limit": CAP}
    assert peak < 4 * CAP, peak  # the cap, one read and bookkeeping; decoding it whole: 100 MB


async def test_a_body_that_does_not_decode_is_upstream_error(fetcher: HttpExecutor, port: int) -> None:
    with pytest.raises(UpstreamError, match="does not decode"):
        await fetcher.execute(_attempt(port, "/broken"))
