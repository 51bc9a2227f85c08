"""http.fetch's SSRF defences against real local HTTP(S) servers, with an injected resolver in
place of DNS: under the default egress policy a listed name that resolves to 127.0.0.1 is
refused, and so are decimal and short IPv4 forms, `::ffff:127.0.0.1`; with the operator allowing
loopback (as the dev stack does) a listed IP literal is reached as asked, and a redirect to a
private address or from https to http is still refused; bad headers are refused before anything
is sent.
Two cases go through a real dispatcher (the resolver injected into the app): a name resolving to
loopback, and header values (outside Latin-1, C1 controls, padded: `invalidInput`, one attempt,
nothing sent; a Latin-1 value arrives as its Latin-1 bytes)."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import pytest_asyncio
from toolbus_common.egress import EgressPolicy
from toolbus_contracts import ToolbusError
from toolbus_contracts.errors import HostNotAllowed, InvalidInput
from toolbus_devstack.tls import make_dev_pki
from toolbus_dispatcher.executors.base import Attempt
from toolbus_dispatcher.executors.http import HttpExecutor
from toolbus_dispatcher.records import CallRecord

from tests.dispatcher.test_dispatcher_helpers import Harness
from tests.support.http_servers import serve_in_thread

pytestmark = pytest.mark.integration

PUBLIC_NAME = "api.public.test"  # resolves to 127.0.0.1 in the stub, as a rebinding DNS would


class _Handler(BaseHTTPRequestHandler):
    hits: list[str] = []
    latin: list[str | None] = []
    """`X-Latin` of each request, as http.server decodes header bytes: Latin-1."""
    cookies: list[str | None] = []

    def log_message(self, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        self.hits.append(self.path)
        self.latin.append(self.headers.get("X-Latin"))
        self.cookies.append(self.headers.get("Cookie"))
        if self.path.startswith("/setcookie"):
            self.send_response(200)
            self.send_header("Set-Cookie", "sess=ALICE-SESSION; Path=/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path.startswith("/to/"):
            self.send_response(302)
            self.send_header("Location", self.path.removeprefix("/to/"))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b"inside"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def plain() -> Iterator[int]:
    with serve_in_thread(ThreadingHTTPServer(("127.0.0.1", 0), _Handler)) as port:
        yield port


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, ssl.SSLContext]]:
    pki = make_dev_pki(tmp_path_factory.mktemp("tls"))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    client = ssl.create_default_context(cafile=str(pki.ca))
    with serve_in_thread(server) as port:
        yield port, client


async def stub_resolver(host: str, port: int) -> list[str]:
    table = {
        PUBLIC_NAME: ["127.0.0.1"],
        "mapped.public.test": ["::ffff:127.0.0.1"],
        "localhost": ["127.0.0.1"],
    }
    if host not in table:
        raise OSError("no such name in the stub")
    return table[host]


def _attempt(url: str, allow: list[str], headers: dict[str, Any] | None = None) -> Attempt:
    toolset = "ts_" + "_".join(allow)  # the executor caches compiled allow-lists by toolset id
    call = CallRecord("call_x", "run_x", "http.fetch", "{}", "key-1", toolset, None, "retry", 1, "running")
    inp: dict[str, Any] = {"url": url}
    if headers is not None:
        inp["headers"] = headers
    return Attempt(call, None, 1, inp, 10.0, tuple(allow))  # type: ignore[arg-type]  # the http tool reads no Tool field


@pytest_asyncio.fixture(loop_scope="session")
async def fetcher(tls: tuple[int, ssl.SSLContext]) -> AsyncIterator[HttpExecutor]:
    """An executor whose operator allows loopback (`127.0.0.0/8`, `localhost`), as the dev stack's."""
    executor = HttpExecutor(
        max_body=1 << 20,
        max_redirects=5,
        egress=EgressPolicy.parse("127.0.0.0/8,localhost"),
        resolver=stub_resolver,
        verify=tls[1],
    )
    try:
        yield executor
    finally:
        await executor.aclose()


@pytest_asyncio.fixture(loop_scope="session")
async def strict() -> AsyncIterator[HttpExecutor]:
    """An executor under the default egress policy: public addresses only."""
    executor = HttpExecutor(max_body=1 << 20, max_redirects=5, resolver=stub_resolver)
    try:
        yield executor
    finally:
        await executor.aclose()


async def _refused(fetcher: HttpExecutor, url: str, allow: list[str]) -> ToolbusError:
    with pytest.raises(HostNotAllowed) as err:
        await fetcher.execute(_attempt(url, allow))
    return err.value


async def test_a_listed_name_that_resolves_to_loopback_is_refused_before_connecting(
    strict: HttpExecutor, plain: int
) -> None:
    before = len(_Handler.hits)
    err = await _refused(strict, f"http://{PUBLIC_NAME}:{plain}/secret", [PUBLIC_NAME])
    assert "egress policy does not allow" in err.message and err.details["host"] == PUBLIC_NAME
    assert len(_Handler.hits) == before  # nothing reached the server
    await _refused(strict, f"http://mapped.public.test:{plain}/", ["*.public.test"])


@pytest.mark.parametrize("host", ["2130706433", "127.1", "0x7f.0.0.1", "[::ffff:127.0.0.1]"])
async def test_loopback_in_number_forms_is_refused_by_a_list_of_names(
    fetcher: HttpExecutor, plain: int, host: str
) -> None:
    await _refused(fetcher, f"http://{host}:{plain}/", ["*.public.test", PUBLIC_NAME])


async def test_a_listed_ip_literal_and_listed_localhost_are_reached(
    fetcher: HttpExecutor, plain: int
) -> None:
    out = await fetcher.execute(_attempt(f"http://127.0.0.1:{plain}/ok", ["127.0.0.1"]))
    assert out["body"] == "inside"
    # the decimal form spells the listed literal: it is that address, so it is reached too
    assert (await fetcher.execute(_attempt(f"http://2130706433:{plain}/ok", ["127.0.0.1"])))["status"] == 200
    assert (await fetcher.execute(_attempt(f"http://localhost:{plain}/ok", ["localhost"])))["status"] == 200


async def test_a_listed_host_with_a_port_is_reached_on_that_port_only(
    fetcher: HttpExecutor, plain: int
) -> None:
    """`localhost:<port>` lets a call reach one local service, not the others on the machine
    (Redis, NATS): any other port, and a redirect to one, is refused before anything is sent."""
    allow = [f"localhost:{plain}"]
    assert (await fetcher.execute(_attempt(f"http://localhost:{plain}/ok", allow)))["status"] == 200
    before = len(_Handler.hits)
    err = await _refused(fetcher, "http://localhost:6379/", allow)
    assert err.message == "Host 'localhost' is on this toolset's http allow-list for other ports, not 6379."
    assert err.details == {"host": "localhost", "port": 6379}
    await _refused(fetcher, "http://localhost/", allow)  # port 80
    await _refused(fetcher, f"http://localhost:{plain}/to/http://localhost:4222/", allow)
    assert _Handler.hits[before:] == ["/to/http://localhost:4222/"]  # the first hop only


async def test_a_cookie_one_call_was_given_is_never_sent_by_another(
    fetcher: HttpExecutor, plain: int
) -> None:
    """The executor's one httpx client kept a cookie jar: a session cookie a server set for one
    end user's call went with every later call of any run, namespace or toolset to that host."""
    await fetcher.execute(_attempt(f"http://127.0.0.1:{plain}/setcookie", ["127.0.0.1"]))
    _Handler.cookies.clear()
    await fetcher.execute(_attempt(f"http://127.0.0.1:{plain}/ok", ["127.0.0.1"]))
    given = await fetcher.execute(
        _attempt(f"http://127.0.0.1:{plain}/ok", ["127.0.0.1"], {"Cookie": "mine=1"})
    )
    assert given["status"] == 200
    assert _Handler.cookies == [None, "mine=1"]  # a caller's own Cookie header still goes


async def test_a_redirect_to_a_private_address_is_refused(fetcher: HttpExecutor, plain: int) -> None:
    # the first hop is listed (an IP literal); the redirect leads to 10.0.0.1, which is listed
    # too but which the operator does not allow (only loopback)
    err = await _refused(fetcher, f"http://127.0.0.1:{plain}/to/http://10.0.0.1/", ["127.0.0.1", "10.0.0.1"])
    assert err.details["host"] == "10.0.0.1" and "egress policy" in err.message
    await _refused(
        fetcher, f"http://127.0.0.1:{plain}/to/http://169.254.169.254/", ["127.0.0.1", "169.254.169.254"]
    )


@pytest.mark.parametrize(
    "location",
    ["mailto:a@b.c", "data:text/plain,hi", "foo:bar", "tel:123", "javascript:alert(1)", "ftp://x/"],
)
async def test_a_redirect_to_what_is_no_http_url_is_refused(
    fetcher: HttpExecutor, plain: int, location: str
) -> None:
    # httpx itself failed on some of these (InvalidURL while building the next request), which
    # ended the call `internal`.
    err = await _refused(fetcher, f"http://127.0.0.1:{plain}/to/{location}", ["127.0.0.1"])
    assert "http" in err.message


async def test_a_redirect_from_https_to_http_is_refused(
    fetcher: HttpExecutor, plain: int, tls: tuple[int, ssl.SSLContext]
) -> None:
    port = tls[0]
    ok = await fetcher.execute(_attempt(f"https://127.0.0.1:{port}/ok", ["127.0.0.1"]))
    assert ok["body"] == "inside"  # https itself works here
    err = await _refused(fetcher, f"https://127.0.0.1:{port}/to/http://127.0.0.1:{plain}/ok", ["127.0.0.1"])
    assert "https to http" in err.message


async def test_header_injection_is_invalid_input_and_nothing_is_sent(
    fetcher: HttpExecutor, plain: int
) -> None:
    before = len(_Handler.hits)
    for headers in ({"X-A": "a\r\nX-Injected: 1"}, {"X-A": "😀"}):
        with pytest.raises(InvalidInput):
            await fetcher.execute(_attempt(f"http://127.0.0.1:{plain}/ok", ["127.0.0.1"], headers))
    assert len(_Handler.hits) == before


async def test_through_a_dispatcher_a_name_resolving_to_loopback_ends_host_not_allowed(
    nats_url: str, redis_url: str, plain: int
) -> None:
    h = Harness(nats_url, redis_url)
    await h.connect()
    try:
        await h.dispatcher(resolver=stub_resolver, egress_allow="")  # the default policy
        ts = await h.toolset({"http": {"allow": [PUBLIC_NAME]}})
        run = await h.open_run(ts)
        data = await h.invoke(run, "http.fetch", {"url": f"http://{PUBLIC_NAME}:{plain}/secret"})
        assert data["outcome"]["status"] == "error"
        assert data["outcome"]["error"]["code"] == "hostNotAllowed"
        bad = await h.invoke(run, "http.fetch", {"url": f"http://{PUBLIC_NAME}/", "headers": {"X": "a\nb"}})
        assert bad["outcome"]["error"]["code"] == "invalidInput"
        got = await h.ok(h.subjects.calls_get, {"callId": bad["callId"]})
        assert got["attempts"] == 1  # not retried as a network fault
    finally:
        await h.close()


async def test_through_a_dispatcher_header_values_go_as_latin1_or_end_invalid_input_unsent(
    nats_url: str, redis_url: str, plain: int
) -> None:
    h = Harness(nats_url, redis_url)
    await h.connect()
    try:
        await h.dispatcher(resolver=stub_resolver)
        run = await h.open_run(await h.toolset({"http": {"allow": ["127.0.0.1"]}}))
        url = f"http://127.0.0.1:{plain}/ok"
        before = len(_Handler.hits)
        for value in ("\u20ac", "\U0001f600", "cafe\u0301", "a\x85b", " padded", "padded\t"):
            bad = await h.invoke(run, "http.fetch", {"url": url, "headers": {"X-Odd": value}})
            error = bad["outcome"]["error"]
            assert error["code"] == "invalidInput" and "X-Odd" in error["message"], (value, bad)
            got = await h.ok(h.subjects.calls_get, {"callId": bad["callId"]})
            assert got["attempts"] == 1 and got["outcome"] == bad["outcome"]
        assert len(_Handler.hits) == before  # nothing was sent
        good = await h.invoke(run, "http.fetch", {"url": url, "headers": {"X-Latin": "caf\u00e9 \u00e0 la"}})
        assert good["outcome"]["status"] == "ok" and good["outcome"]["output"]["body"] == "inside"
        assert _Handler.latin[-1] == "caf\u00e9 \u00e0 la"  # the Latin-1 bytes, not UTF-8
    finally:
        await h.close()
