"""A plain HTTP server from the standard library in a thread, for tests that need a web server
(the http tool's targets): `with serve_in_thread(ThreadingHTTPServer(...)) as port:`."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer


@contextlib.contextmanager
def serve_in_thread(server: ThreadingHTTPServer) -> Iterator[int]:
    """Serve until the block ends; yields the port. The server is shut down and closed after."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
