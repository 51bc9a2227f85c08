"""What one `http.fetch` can cost the dispatcher's event loop, beside what it cost before, in the
same run against a local HTTP server:

- one send of N request headers through `http.fetch`'s client (no cookie jar) beside httpx's
  client with a cookie jar that keeps nothing (what it had: `extract_cookies` copies the request's
  headers with a lookup per header, quadratic in N); N is over the bound `http.fetch` takes
  (100), to show the cost the bound and the jar-less client each remove;
- a `Content-Encoding` of N stacked `gzip`s on an empty body: `BoundedDecoder` refusing it (more
  than 5) beside decoding every layer, as the decoder did before (each layer's flush fed through
  the layers after it: quadratic in N).

    uv run python bench/http_fetch_bounds.py [--headers 2500,5000] [--codings 1000,2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import threading
import time
import zlib
from http.cookiejar import CookieJar, DefaultCookiePolicy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from toolbus_dispatcher.executors.http import _CookielessClient
from toolbus_mcp_client.decoding import BoundedDecoder, TooManyCodings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import Figure, print_table

SECTION = "http.fetch bounds"


class _Empty(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


async def _send_ms(client: httpx.AsyncClient, port: int, n: int) -> float:
    headers = [(f"X-H{i:05d}".encode(), b"v") for i in range(n)]
    request = client.build_request("GET", f"http://127.0.0.1:{port}/", headers=headers)
    started = time.perf_counter()
    response = await client.send(request)
    took = (time.perf_counter() - started) * 1000
    assert response.status_code == 200
    await client.aclose()
    return took


def _layered_ms(n: int) -> float:
    """Every layer of N gzips decoded as the decoder did before the bound (flush of each layer
    fed through the layers after it)."""
    layers = [zlib.decompressobj(zlib.MAX_WBITS | 16) for _ in range(n)]
    started = time.perf_counter()
    for i, layer in enumerate(layers):
        data = layer.flush()
        for after in layers[i + 1 :]:
            data = after.decompress(data)
    return (time.perf_counter() - started) * 1000


def _refused_ms(n: int) -> float:
    started = time.perf_counter()
    with contextlib.suppress(TooManyCodings):
        BoundedDecoder(", ".join(["gzip"] * n), 64 << 20).flush()
    return (time.perf_counter() - started) * 1000


async def measure(header_counts: list[int], coding_counts: list[int]) -> list[Figure]:
    import http.client

    http.client._MAXHEADERS = 1 << 20  # type: ignore[attr-defined]  # the test server reads them all
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Empty)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    figures: list[Figure] = []
    try:
        for n in header_counts:
            jar = CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))
            before = await _send_ms(httpx.AsyncClient(cookies=jar), port, n)
            after = await _send_ms(_CookielessClient(), port, n)
            figures.append(
                Figure(SECTION, f"send {n} headers, no jar", after, "ms", "httpx with its jar", before)
            )
        for n in coding_counts:
            figures.append(
                Figure(
                    SECTION,
                    f"{n} stacked gzips refused",
                    _refused_ms(n),
                    "ms",
                    "every layer decoded",
                    _layered_ms(n),
                )
            )
    finally:
        server.shutdown()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headers", default="2500,5000")
    parser.add_argument("--codings", default="1000,2000")
    args = parser.parse_args()
    figures = asyncio.run(
        measure([int(n) for n in args.headers.split(",")], [int(n) for n in args.codings.split(",")])
    )
    print_table(figures, "http.fetch: the event loop's time for one bad request or response")


if __name__ == "__main__":
    main()
