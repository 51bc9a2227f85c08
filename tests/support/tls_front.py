"""TLS in front of a plain-HTTP service, as a deployment's proxy would put it: a forwarder on a
free loopback port with a certificate for 127.0.0.1 from a throwaway CA (`make_dev_pki`), passing bytes to the
service's port. `async with TlsFront(target_port, tmp) as front:` `front.url`
(`https://127.0.0.1:<port>`), `front.ca_file` (the certificate to trust), `front.client()` (an
`ssl.SSLContext` trusting it)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path

from toolbus_devstack.tls import make_dev_pki


class TlsFront:
    def __init__(self, target_port: int, directory: Path) -> None:
        self.target_port = target_port
        pki = make_dev_pki(directory)
        self.ca_file = pki.ca
        self._cert_file, self._key_file = pki.server_cert, pki.server_key
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def client(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    async def __aenter__(self) -> TlsFront:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self._cert_file, self._key_file)
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=context)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        pipes = [
            asyncio.create_task(self._pipe(reader, up_writer)),
            asyncio.create_task(self._pipe(up_reader, writer)),
        ]
        self._tasks.update(pipes)
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pipes:
                task.cancel()
                self._tasks.discard(task)
            for w in (writer, up_writer):
                w.close()

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, ssl.SSLError):
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
